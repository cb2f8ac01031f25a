//! ShareGPT conversations as a workload (`--trace-format sharegpt`): [`ShareGptWorkload`] streams
//! a JSONL file (one conversation per line) or a JSON array of conversations (the dataset files'
//! own shape), record by record, and turns each answer of a conversation into one chat request:
//! the turns before the answer are its messages (earlier answers taken from the data, so the k-th
//! request of a conversation starts with the text of every earlier one), the answer's length in
//! words its output length.
//!
//! A conversation is `{"conversations": [{"from": "human", "value": ".."}, {"from": "gpt", ..}]}`
//! (`from`: `human`/`user`, `gpt`/`assistant`/`chatgpt`/`bing`/`bard`/`model`, `system`) or
//! `{"messages": [{"role": "user", "content": ".."}, ..]}` (also `conversation`; `content` a
//! string or text parts). Up to `--active-conversations` are in progress at once; each request
//! continues one of them, picked by a generator seeded with `--seed`, so conversations interleave
//! as users' would and the same seed gives the same order. There are no timestamps: requests are
//! paced by `--rate` or a closed loop.

use std::borrow::Cow;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::conversation::{ChatPrompt, Role, Turn};
use super::limits::{
    CONVERSATIONS_ACTIVE_MAX, CONVERSATION_BYTES_MAX, CONVERSATION_TURNS_MAX, OUTPUT_TOKENS_MAX,
};
use super::records::{RecordRead, RecordReader};
use super::skip::{Skip, SkipKind, Warnings};
use super::workload::{Content, WorkItem, Workload};

/// How a ShareGPT file is replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareGptOptions {
    /// Conversations in progress at once (1 = one conversation after another).
    pub active_conversations: usize,
    /// Seeds the choice of which conversation continues next.
    pub seed: u64,
    /// Read the file again when it ends (`--loop`), every pass fresh content.
    pub repeat: bool,
}

impl ShareGptOptions {
    /// Checks the bounds; the error names the flag to change.
    pub fn validate(&self) -> Result<(), String> {
        if (1..=CONVERSATIONS_ACTIVE_MAX).contains(&self.active_conversations) {
            Ok(())
        } else {
            Err(format!(
                "--active-conversations must be between 1 and {CONVERSATIONS_ACTIVE_MAX}"
            ))
        }
    }
}

/// A conversation ready to send: its turns, and for each answer to send, where it is and its
/// length.
#[derive(Clone, Debug, PartialEq)]
pub struct Conversation {
    pub turns: Arc<[Turn]>,
    /// `(index of an answer in turns, its length in words)`, in order.
    pub answers: Vec<(usize, u32)>,
}

#[derive(Deserialize)]
struct RawRecord<'a> {
    #[serde(default, borrow)]
    conversations: Option<Vec<RawShareGptTurn<'a>>>,
    #[serde(default, borrow, alias = "conversation")]
    messages: Option<Vec<RawMessage<'a>>>,
}

/// A turn's text stays the JSON the file has (`RawValue`): it is copied to the wire as it is.
#[derive(Deserialize)]
struct RawShareGptTurn<'a> {
    #[serde(borrow)]
    from: Cow<'a, str>,
    #[serde(borrow)]
    value: &'a RawValue,
}

#[derive(Deserialize)]
struct RawMessage<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(default, borrow)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawPart {
    #[serde(default)]
    text: Option<String>,
}

/// Parses one conversation record; pass `pass` (≥ 1) of `--loop` starts its first turn with the
/// word `loop-<pass>`, so the pass is new content to every cache.
pub fn parse_conversation(record: &[u8], pass: u64) -> Result<Conversation, Skip> {
    let raw: RawRecord = serde_json::from_slice(record)
        .map_err(|e| Skip::malformed(format!("not a ShareGPT conversation: {e}")))?;
    let mut turns: Vec<Turn> = match (raw.conversations, raw.messages) {
        (Some(turns), _) => turns
            .into_iter()
            .map(|t| sharegpt_turn(&t.from, t.value))
            .collect::<Result<_, Skip>>()?,
        (None, Some(messages)) => messages
            .into_iter()
            .map(|m| message_turn(&m.role, m.content))
            .collect::<Result<_, Skip>>()?,
        (None, None) => {
            return Err(Skip::malformed(
                "neither `conversations` nor `messages` is a list of turns",
            ))
        }
    };
    if turns.len() > CONVERSATION_TURNS_MAX {
        return Err(Skip::out_of_bounds(format!(
            "{} turns, at most {CONVERSATION_TURNS_MAX}",
            turns.len()
        )));
    }
    if let (true, Some(first)) = (pass > 0, turns.first_mut()) {
        first.prefix_word(&format!("loop-{pass}"));
    }
    let answers = answers_of(&turns);
    if answers.is_empty() {
        return Err(Skip::unsupported("no user turn is followed by an answer"));
    }
    Ok(Conversation {
        turns: Arc::from(turns),
        answers,
    })
}

fn sharegpt_turn(from: &str, value: &RawValue) -> Result<Turn, Skip> {
    Turn::from_json(role_of(from)?, value.get())
        .ok_or_else(|| Skip::malformed("a turn's `value` is not a string"))
}

/// A message's `content`: a string (kept as written), text parts (joined by newlines), or none.
fn message_turn(role: &str, content: Option<&RawValue>) -> Result<Turn, Skip> {
    let role = role_of(role)?;
    let Some(content) = content else {
        return Ok(Turn::from_text(role, ""));
    };
    if let Some(turn) = Turn::from_json(role, content.get()) {
        return Ok(turn);
    }
    match serde_json::from_str::<Option<Vec<RawPart>>>(content.get()) {
        Ok(parts) => {
            let texts: Vec<String> = parts.into_iter().flatten().filter_map(|p| p.text).collect();
            Ok(Turn::from_text(role, &texts.join("\n")))
        }
        Err(_) => Err(Skip::malformed(
            "a message's `content` is not a string or a list of parts",
        )),
    }
}

fn role_of(name: &str) -> Result<Role, Skip> {
    match name.to_ascii_lowercase().as_str() {
        "human" | "user" => Ok(Role::User),
        "gpt" | "assistant" | "chatgpt" | "bing" | "bard" | "model" => Ok(Role::Assistant),
        "system" => Ok(Role::System),
        _ => Err(Skip::unsupported(format!("unknown role {name:?}"))),
    }
}

/// Every answer that follows a user turn (an answer before any question has nothing to answer),
/// with its length in words (sim-engine's tokens), at least 1 and at most `OUTPUT_TOKENS_MAX`.
fn answers_of(turns: &[Turn]) -> Vec<(usize, u32)> {
    let mut asked = false;
    let mut answers = Vec::new();
    for (i, turn) in turns.iter().enumerate() {
        match turn.role {
            Role::User => asked = true,
            Role::Assistant if asked => {
                let words = turn.words().clamp(1, OUTPUT_TOKENS_MAX as usize) as u32;
                answers.push((i, words));
            }
            Role::Assistant | Role::System => {}
        }
    }
    answers
}

/// A conversation being sent.
struct Active {
    conversation: Conversation,
    /// The next answer to send.
    next: usize,
    key: u64,
}

/// A ShareGPT file as a workload.
pub struct ShareGptWorkload {
    path: PathBuf,
    label: String,
    options: ShareGptOptions,
    records: RecordReader<BufReader<File>>,
    record: Vec<u8>,
    rng: fastrand::Rng,
    active: Vec<Active>,
    pass: u64,
    conversations_this_pass: u64,
    next_conversation: u64,
    next_id: u64,
    file_ended: bool,
    warnings: Warnings,
}

impl ShareGptWorkload {
    /// Opens `path` (the first record is read only when the first request is asked for).
    pub fn open(path: &Path, options: ShareGptOptions) -> Result<Self, String> {
        options.validate()?;
        let file = File::open(path).map_err(|e| format!("--trace {}: {e}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            label: path.display().to_string(),
            rng: fastrand::Rng::with_seed(options.seed),
            options,
            records: Self::reader(file),
            record: Vec::new(),
            active: Vec::new(),
            pass: 0,
            conversations_this_pass: 0,
            next_conversation: 0,
            next_id: 0,
            file_ended: false,
            warnings: Warnings::default(),
        })
    }

    fn reader(file: File) -> RecordReader<BufReader<File>> {
        RecordReader::new(
            BufReader::with_capacity(256 * 1024, file),
            CONVERSATION_BYTES_MAX,
        )
    }

    /// The next valid conversation, reading the file again for `--loop`; `None` when there is none.
    fn next_conversation(&mut self) -> Option<Conversation> {
        loop {
            if self.file_ended && !self.rewind() {
                return None;
            }
            let (line_number, skip) = match self.records.next_record(&mut self.record) {
                Ok(RecordRead::Record { line_number }) => {
                    match parse_conversation(&self.record, self.pass) {
                        Ok(conversation) => {
                            self.conversations_this_pass += 1;
                            return Some(conversation);
                        }
                        Err(skip) => (line_number, skip),
                    }
                }
                Ok(RecordRead::End) => {
                    self.file_ended = true;
                    continue;
                }
                Ok(RecordRead::TooLong { line_number }) => {
                    let detail =
                        format!("a conversation longer than {CONVERSATION_BYTES_MAX} bytes");
                    (line_number, Skip::new(SkipKind::TooLong, detail))
                }
                Ok(RecordRead::NotAnObject { line_number }) => (
                    line_number,
                    Skip::malformed("an array element that is not an object"),
                ),
                Ok(RecordRead::Truncated { line_number }) => (
                    line_number,
                    Skip::malformed("the file ends inside this conversation"),
                ),
                Err(e) => {
                    self.file_ended = true;
                    (
                        0,
                        Skip::new(SkipKind::Unreadable, format!("read error: {e}")),
                    )
                }
            };
            self.warnings.skip_line(&self.label, line_number, &skip);
        }
    }

    /// Starts the next pass of `--loop`; false when not looping, the last pass had no valid
    /// conversation, or the file cannot be opened again.
    fn rewind(&mut self) -> bool {
        if !self.options.repeat || self.conversations_this_pass == 0 {
            return false;
        }
        let Ok(file) = File::open(&self.path) else {
            let skip = Skip::new(
                SkipKind::Unreadable,
                "could not reopen the trace for --loop",
            );
            self.warnings.skip_line(&self.label, 0, &skip);
            self.options.repeat = false;
            return false;
        };
        self.records = Self::reader(file);
        self.pass += 1;
        self.conversations_this_pass = 0;
        self.file_ended = false;
        true
    }
}

impl Workload for ShareGptWorkload {
    fn next_item(&mut self) -> Option<WorkItem> {
        while self.active.len() < self.options.active_conversations {
            let Some(conversation) = self.next_conversation() else {
                break;
            };
            let key = self.next_conversation;
            self.next_conversation += 1;
            self.active.push(Active {
                conversation,
                next: 0,
                key,
            });
        }
        if self.active.is_empty() {
            return None;
        }
        let index = self.rng.usize(..self.active.len());
        let active = &mut self.active[index];
        let (answer_at, output_tokens) = active.conversation.answers[active.next];
        active.next += 1;
        let prompt = ChatPrompt::new(active.conversation.turns.clone(), answer_at);
        let tenant_key = active.key;
        if active.next == active.conversation.answers.len() {
            self.active.swap_remove(index);
        }
        let id = self.next_id;
        self.next_id += 1;
        Some(WorkItem {
            id,
            arrival_ms: None,
            content: Content::Chat(prompt),
            output_tokens,
            tenant_key,
        })
    }

    fn warnings(&self) -> &Warnings {
        &self.warnings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_answer_is_a_request_of_the_turns_before_it() {
        let record = br#"{"id": "x", "conversations": [
            {"from": "system", "value": "be kind"},
            {"from": "gpt", "value": "an answer to nothing"},
            {"from": "human", "value": "first question"},
            {"from": "gpt", "value": "first answer here"},
            {"from": "human", "value": "second"},
            {"from": "human", "value": "third"},
            {"from": "gpt", "value": ""},
            {"from": "human", "value": "unanswered"}]}"#;
        let conversation = parse_conversation(record, 0).unwrap();
        assert_eq!(conversation.turns.len(), 8);
        assert_eq!(conversation.answers, vec![(3, 3), (6, 1)]);
        let looped = parse_conversation(record, 2).unwrap();
        assert_eq!(looped.turns[0].text(), "loop-2 be kind");
    }

    #[test]
    fn openai_messages_and_their_parts_are_read() {
        let record = br#"{"messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "c d"}]}"#;
        let conversation = parse_conversation(record, 0).unwrap();
        assert_eq!(conversation.turns[0].text(), "a\nb");
        assert_eq!(conversation.answers, vec![(1, 2)]);
    }

    #[test]
    fn bad_conversations_are_refused_by_kind() {
        let kind = |record: &str| parse_conversation(record.as_bytes(), 0).unwrap_err().kind;
        assert_eq!(kind("[]"), SkipKind::Malformed);
        assert_eq!(kind(r#"{"id": 1}"#), SkipKind::Malformed);
        assert_eq!(
            kind(r#"{"conversations": [{"from": "tool", "value": "x"}]}"#),
            SkipKind::Unsupported
        );
        assert_eq!(
            kind(r#"{"conversations": [{"from": "human", "value": "x"}]}"#),
            SkipKind::Unsupported
        );
        let many = vec![r#"{"from": "human", "value": "x"}"#; CONVERSATION_TURNS_MAX + 1];
        let record = format!(r#"{{"conversations": [{}]}}"#, many.join(","));
        assert_eq!(kind(&record), SkipKind::OutOfBounds);
    }
}
