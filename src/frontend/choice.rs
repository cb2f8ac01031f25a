//! The output side of a request before framing: each choice's token IDs through the
//! detokenizer and the stop matcher, into the text a writer sends and how the choice ended.

use std::sync::Arc;

use super::output::{Finish, FinishReason};
use super::params::GenerateParams;
use crate::tokenize::{DecodeStream, DecodeTable, MatchedStop, StopMatcher, StopSet, StopState};

/// One choice's state.
#[derive(Debug)]
struct Choice {
    decode: DecodeStream,
    stop: StopMatcher,
    /// Scratch: the detokenizer's text of this step, before the stop matcher.
    decoded: String,
    /// The text of this step, for the writer.
    text: String,
    finish: Option<Finish>,
    tokens: u32,
}

/// What one call decoded for one choice.
#[derive(Clone, Copy, Debug)]
pub struct Decoded<'a> {
    /// The text the client may see now.
    pub text: &'a str,
    /// How many of the IDs given count as output (a stop token ends the choice: the IDs after
    /// it are dropped; the stop token itself counts).
    pub ids_used: usize,
    /// Set when the choice ended, by a stop here or by the engine.
    pub finish: Option<&'a Finish>,
}

/// A request's `n` choices on their way from token IDs to text.
#[derive(Debug)]
pub struct OutputDecoder {
    table: Arc<DecodeTable>,
    stops: StopSet,
    min_tokens: u32,
    choices: Vec<Choice>,
}

impl OutputDecoder {
    /// The decoder of a request: `params`' stops, `stop_token_ids`, `skip_special_tokens`,
    /// `n` and `min_tokens`; `eos_token_ids` are the model's (they stop a choice unless
    /// `ignore_eos`).
    pub fn new(table: Arc<DecodeTable>, params: &GenerateParams, eos_token_ids: &[u32]) -> Self {
        let mut token_ids = params.stop_token_ids.clone();
        if !params.ignore_eos {
            token_ids.extend_from_slice(eos_token_ids);
        }
        let stops = StopSet::new(params.stop.clone(), token_ids, params.keep_stop);
        let choices = (0..params.n.max(1))
            .map(|_| Choice {
                decode: DecodeStream::new(&table, params.skip_special_tokens),
                stop: StopMatcher::new(),
                decoded: String::new(),
                text: String::new(),
                finish: None,
                tokens: 0,
            })
            .collect();
        OutputDecoder {
            table,
            stops,
            min_tokens: params.sampling.min_tokens.unwrap_or(0),
            choices,
        }
    }

    /// The decode table (logprobs' token text).
    pub fn table(&self) -> &DecodeTable {
        &self.table
    }

    /// Output tokens counted so far, over every choice.
    pub fn completion_tokens(&self) -> u32 {
        self.choices.iter().map(|c| c.tokens).sum()
    }

    /// Whether every choice has ended.
    pub fn all_finished(&self) -> bool {
        self.choices.iter().all(|c| c.finish.is_some())
    }

    /// Decodes choice `index`'s new token IDs. A stop token or stop string ends the choice
    /// (`Decoded::finish`); the transport then need not wait for the engine's end. IDs for a
    /// choice that ended, or an index past `n`, are ignored.
    pub fn push(&mut self, index: u32, ids: &[u32]) -> Decoded<'_> {
        let Some(choice) = self.choices.get_mut(index as usize) else {
            return Decoded {
                text: "",
                ids_used: 0,
                finish: None,
            };
        };
        choice.text.clear();
        if choice.finish.is_some() {
            return Decoded {
                text: "",
                ids_used: 0,
                finish: None,
            };
        }
        let mut used = 0;
        for &id in ids {
            used += 1;
            choice.tokens += 1;
            // vLLM checks stops once the output holds `min_tokens` tokens.
            let armed = choice.tokens >= self.min_tokens;
            if let Some(matched) = self.stops.token(id).filter(|_| armed) {
                choice
                    .stop
                    .push(&self.stops, &choice.decoded, &mut choice.text);
                choice.decoded.clear();
                choice.stop.finish(&mut choice.text);
                choice.finish = Some(Finish {
                    reason: FinishReason::Stop,
                    matched: Some(matched),
                });
                break;
            }
            choice.decode.step(&self.table, id, &mut choice.decoded);
            if armed && !self.stops.strings().is_empty() {
                let state = choice
                    .stop
                    .push(&self.stops, &choice.decoded, &mut choice.text);
                choice.decoded.clear();
                if let StopState::Stopped(matched) = state {
                    choice.finish = Some(Finish {
                        reason: FinishReason::Stop,
                        matched: Some(matched),
                    });
                    break;
                }
            }
        }
        if choice.finish.is_none() {
            choice.text.push_str(&choice.decoded);
            choice.decoded.clear();
        }
        Decoded {
            text: &choice.text,
            ids_used: used,
            finish: choice.finish.as_ref(),
        }
    }

    /// The engine ended choice `index` (`reason`; `matched` when the engine names the stop):
    /// the held text is written. A choice that a stop here already ended keeps its finish.
    pub fn finish(
        &mut self,
        index: u32,
        reason: FinishReason,
        matched: Option<MatchedStop>,
    ) -> Decoded<'_> {
        let Some(choice) = self.choices.get_mut(index as usize) else {
            return Decoded {
                text: "",
                ids_used: 0,
                finish: None,
            };
        };
        choice.text.clear();
        if choice.finish.is_none() {
            choice.decode.finish(&self.table, &mut choice.decoded);
            let state = choice
                .stop
                .push(&self.stops, &choice.decoded, &mut choice.text);
            choice.decoded.clear();
            choice.stop.finish(&mut choice.text);
            choice.finish = Some(match state {
                StopState::Stopped(found) => Finish {
                    reason: FinishReason::Stop,
                    matched: Some(found),
                },
                StopState::Running => Finish { reason, matched },
            });
        }
        Decoded {
            text: &choice.text,
            ids_used: 0,
            finish: choice.finish.as_ref(),
        }
    }
}
