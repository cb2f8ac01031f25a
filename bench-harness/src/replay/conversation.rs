//! Real chat text: a [`ChatPrompt`] is the first `len` turns of a conversation that several
//! requests share (`Arc`), so the k-th request of a ShareGPT conversation re-sends the k-1 turns
//! before it without copying them. [`ChatPrompt::write_messages`] and
//! [`ChatPrompt::write_flat_text`] put it on the wire (JSON-escaped), as chat `messages` or as one
//! prompt for completions and `/generate`.

use std::sync::Arc;

/// Who said a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    /// The OpenAI chat role name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
        }
    }
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    pub role: Role,
    pub text: Box<str>,
}

/// The first `len` turns of a shared conversation: the messages of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatPrompt {
    turns: Arc<[Turn]>,
    len: usize,
}

impl ChatPrompt {
    /// The first `len` turns of `turns` (all of them when `len` is larger).
    pub fn new(turns: Arc<[Turn]>, len: usize) -> Self {
        let len = len.min(turns.len());
        Self { turns, len }
    }

    /// One user message: a prompt that is only text (a decoded token-id prompt).
    pub fn user_text(text: String) -> Self {
        let turn = Turn {
            role: Role::User,
            text: text.into_boxed_str(),
        };
        Self::new(Arc::from(vec![turn]), 1)
    }

    /// The turns this prompt sends, in order.
    pub fn turns(&self) -> &[Turn] {
        &self.turns[..self.len]
    }

    /// Bytes of text in all turns (to size a body before writing it).
    pub fn text_bytes(&self) -> usize {
        self.turns().iter().map(|t| t.text.len()).sum()
    }

    /// `[{"role":"user","content":"..."},...]`
    pub fn write_messages(&self, out: &mut Vec<u8>) {
        out.push(b'[');
        for (i, turn) in self.turns().iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"role\":\"");
            out.extend_from_slice(turn.role.as_str().as_bytes());
            out.extend_from_slice(b"\",\"content\":");
            write_json_str(&turn.text, out);
            out.push(b'}');
        }
        out.push(b']');
    }

    /// Every turn's text joined by a newline, as one JSON string: what a completions or
    /// `/generate` request sends. A later turn's prompt starts with an earlier turn's.
    pub fn write_flat_text(&self, out: &mut Vec<u8>) {
        let mut text = String::with_capacity(self.text_bytes() + self.len);
        for (i, turn) in self.turns().iter().enumerate() {
            if i > 0 {
                text.push('\n');
            }
            text.push_str(&turn.text);
        }
        write_json_str(&text, out);
    }
}

/// `text` as a JSON string literal.
pub fn write_json_str(text: &str, out: &mut Vec<u8>) {
    // Writing a `str` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conversation() -> Arc<[Turn]> {
        let turn = |role, text: &str| Turn {
            role,
            text: text.into(),
        };
        Arc::from(vec![
            turn(Role::System, "be \"brief\""),
            turn(Role::User, "hello"),
            turn(Role::Assistant, "hi\nthere"),
            turn(Role::User, "again"),
        ])
    }

    #[test]
    fn messages_are_json_with_roles_in_order() {
        let mut out = Vec::new();
        ChatPrompt::new(conversation(), 3).write_messages(&mut out);
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            value,
            serde_json::json!([
                {"role": "system", "content": "be \"brief\""},
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "hi\nthere"},
            ])
        );
    }

    #[test]
    fn flat_text_of_a_later_turn_starts_with_an_earlier_one() {
        let text = |len| {
            let mut out = Vec::new();
            ChatPrompt::new(conversation(), len).write_flat_text(&mut out);
            serde_json::from_slice::<String>(&out).unwrap()
        };
        assert_eq!(text(2), "be \"brief\"\nhello");
        assert!(text(4).starts_with(&text(2)));
        assert_eq!(ChatPrompt::new(conversation(), 9).turns().len(), 4);
    }
}
