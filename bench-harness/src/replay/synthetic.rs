//! The built-in shared-prefix workload: `groups` system prompts, each shared by
//! `prompts_per_group` conversations. Every request picks a group (uniformly or by Zipf
//! popularity) and a conversation of it; with `turns > 1` a conversation grows turn by turn (its
//! previous questions and answers stay in the prompt), and starts afresh after its last turn.
//! Deterministic for a seed; holds one small counter per conversation, nothing per request.

use super::content::{seed_of, Prompt};
use super::limits::{OUTPUT_TOKENS_MAX, PROMPT_TOKENS_MAX};
use super::skip::Warnings;
use super::workload::{Content, WorkItem, Workload};

/// Conversations (groups × prompts per group) one generator tracks: 8 bytes each.
pub const CONVERSATIONS_MAX: u64 = 1 << 22;

/// Turns one conversation may grow to before it restarts.
pub const TURNS_MAX: u32 = 64;

/// How requests spread over groups.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Popularity {
    Uniform,
    /// Group `k` (0-based) is picked with weight `1 / (k + 1)^s`.
    Zipf {
        exponent: f64,
    },
}

/// Generator settings (the `--synthetic` flags).
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticSpec {
    pub groups: u32,
    pub prompts_per_group: u32,
    pub system_prompt_tokens: u32,
    pub question_tokens: u32,
    pub output_tokens: u32,
    pub popularity: Popularity,
    pub turns: u32,
    pub seed: u64,
    /// Requests generated (default: every conversation through every turn, once on average).
    pub requests: Option<u64>,
}

impl SyntheticSpec {
    /// Checks the bounds; the error names the flag to change.
    pub fn validate(&self) -> Result<(), String> {
        let conversations = u64::from(self.groups) * u64::from(self.prompts_per_group);
        if self.groups == 0 || self.prompts_per_group == 0 || conversations > CONVERSATIONS_MAX {
            return Err(format!(
                "--groups × --prompts-per-group must be between 1 and {CONVERSATIONS_MAX}"
            ));
        }
        if self.turns == 0 || self.turns > TURNS_MAX {
            return Err(format!("--turns must be between 1 and {TURNS_MAX}"));
        }
        let longest = u64::from(self.system_prompt_tokens)
            + u64::from(self.turns) * u64::from(self.question_tokens)
            + u64::from(self.turns - 1) * u64::from(self.output_tokens);
        if longest == 0 || longest > u64::from(PROMPT_TOKENS_MAX) {
            return Err(format!(
                "the longest prompt (--system-prompt-len + turns of --question-len and answers) \
                 must be between 1 and {PROMPT_TOKENS_MAX} tokens, not {longest}"
            ));
        }
        if self.output_tokens == 0 || self.output_tokens > OUTPUT_TOKENS_MAX {
            return Err(format!(
                "--output-len must be between 1 and {OUTPUT_TOKENS_MAX}"
            ));
        }
        if let Popularity::Zipf { exponent } = self.popularity {
            if !(exponent.is_finite() && exponent > 0.0) {
                return Err("--zipf-exponent must be above 0".into());
            }
        }
        Ok(())
    }

    /// The number of requests the generator makes.
    pub fn request_count(&self) -> u64 {
        self.requests.unwrap_or(
            u64::from(self.groups) * u64::from(self.prompts_per_group) * u64::from(self.turns),
        )
    }
}

/// Where one conversation is: how many times it restarted, and its next turn.
#[derive(Clone, Copy, Default)]
struct Conversation {
    generation: u32,
    next_turn: u32,
}

/// The generator as a workload.
pub struct SyntheticWorkload {
    spec: SyntheticSpec,
    rng: fastrand::Rng,
    /// Cumulative group weights, for popularity sampling.
    group_cdf: Vec<f64>,
    conversations: Vec<Conversation>,
    next_id: u64,
    left: u64,
    warnings: Warnings,
}

impl SyntheticWorkload {
    pub fn new(spec: SyntheticSpec) -> Result<Self, String> {
        spec.validate()?;
        let weights = (0..spec.groups).map(|k| match spec.popularity {
            Popularity::Uniform => 1.0,
            Popularity::Zipf { exponent } => 1.0 / f64::from(k + 1).powf(exponent),
        });
        let mut total = 0.0;
        let group_cdf = weights.map(|w| {
            total += w;
            total
        });
        let group_cdf: Vec<f64> = group_cdf.collect();
        let conversations = spec.groups as usize * spec.prompts_per_group as usize;
        Ok(Self {
            rng: fastrand::Rng::with_seed(spec.seed),
            group_cdf,
            conversations: vec![Conversation::default(); conversations],
            next_id: 0,
            left: spec.request_count(),
            warnings: Warnings::default(),
            spec,
        })
    }

    fn pick_group(&mut self) -> u32 {
        let total = self.group_cdf.last().copied().unwrap_or(1.0);
        let x = self.rng.f64() * total;
        let k = self.group_cdf.partition_point(|&c| c <= x);
        k.min(self.group_cdf.len() - 1) as u32
    }

    /// The prompt of `conversation`'s turn `turn`: the group's system prompt, then each earlier
    /// turn's question and answer, then this turn's question.
    fn prompt(&self, group: u32, slot: u32, conversation: Conversation, turn: u32) -> Prompt {
        let spec = &self.spec;
        let mut prompt = Prompt::default();
        prompt.push(
            seed_of("synthetic-system", &[spec.seed, u64::from(group)]),
            spec.system_prompt_tokens,
        );
        let key = [
            spec.seed,
            u64::from(group),
            u64::from(slot),
            u64::from(conversation.generation),
        ];
        for earlier in 0..=turn {
            let turn_key = [key[0], key[1], key[2], key[3], u64::from(earlier)];
            prompt.push(
                seed_of("synthetic-question", &turn_key),
                spec.question_tokens,
            );
            if earlier < turn {
                prompt.push(seed_of("synthetic-answer", &turn_key), spec.output_tokens);
            }
        }
        prompt
    }
}

impl Workload for SyntheticWorkload {
    fn next_item(&mut self) -> Option<WorkItem> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let group = self.pick_group();
        let slot = self.rng.u32(0..self.spec.prompts_per_group);
        let index = (group * self.spec.prompts_per_group + slot) as usize;
        let conversation = self.conversations[index];
        let turn = conversation.next_turn;
        let prompt = self.prompt(group, slot, conversation, turn);
        self.conversations[index] = if turn + 1 >= self.spec.turns {
            Conversation {
                generation: conversation.generation + 1,
                next_turn: 0,
            }
        } else {
            Conversation {
                generation: conversation.generation,
                next_turn: turn + 1,
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        let output_tokens = self.spec.output_tokens;
        Some(WorkItem {
            id,
            arrival_ms: None,
            content: Content::Generated(prompt),
            output_tokens,
            tenant_key: u64::from(group),
        })
    }

    fn warnings(&self) -> &Warnings {
        &self.warnings
    }
}
