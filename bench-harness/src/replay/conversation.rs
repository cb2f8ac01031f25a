//! Real chat text: a [`ChatPrompt`] is the first `len` turns of a conversation that several
//! requests share (`Arc`), so the k-th request of a ShareGPT conversation re-sends the k-1 turns
//! before it without copying them. A [`Turn`] keeps its text as the JSON string the data wrote;
//! [`ChatPrompt::write_messages`] and [`ChatPrompt::write_flat_text`] copy it onto the wire, as
//! chat `messages` or as one prompt for completions and `/generate`.

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

/// One message of a conversation. Its text is kept as the JSON string literal the data wrote
/// (quotes and escapes included), so it goes on the wire as a copy, never unescaped and escaped
/// again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    pub role: Role,
    json: Box<str>,
}

impl Turn {
    /// A turn of `text`.
    pub fn from_text(role: Role, text: &str) -> Self {
        let mut json = Vec::with_capacity(text.len() + 2);
        write_json_str(text, &mut json);
        // serde_json writes valid UTF-8.
        let json = String::from_utf8(json).unwrap_or_default().into_boxed_str();
        Self { role, json }
    }

    /// A turn whose text is the JSON string literal `json`; `None` when `json` is not one.
    pub fn from_json(role: Role, json: &str) -> Option<Self> {
        let is_literal = json.len() >= 2 && json.starts_with('"') && json.ends_with('"');
        is_literal.then(|| Self {
            role,
            json: json.into(),
        })
    }

    /// The text, unescaped.
    pub fn text(&self) -> String {
        serde_json::from_str(&self.json).unwrap_or_default()
    }

    /// The text between the quotes, still escaped.
    fn escaped(&self) -> &str {
        &self.json[1..self.json.len() - 1]
    }

    /// Puts `word` and a space before the text.
    pub fn prefix_word(&mut self, word: &str) {
        let mut json = String::with_capacity(self.json.len() + word.len() + 1);
        json.push('"');
        // A word of the replay's own (`loop-3`) needs no escaping.
        json.push_str(word);
        json.push(' ');
        json.push_str(&self.json[1..]);
        self.json = json.into_boxed_str();
    }

    /// Words of the text, as `str::split_ascii_whitespace` counts them (sim-engine's tokens),
    /// read from the escaped text: `\n`, `\t`, `\r`, `\f` and their `\u00XX` forms separate.
    pub fn words(&self) -> usize {
        let bytes = self.escaped().as_bytes();
        let (mut words, mut in_word, mut i) = (0, false, 0);
        while i < bytes.len() {
            let (space, width) = match bytes[i] {
                b'\\' => escape_is_space(&bytes[i + 1..]),
                byte => (byte.is_ascii_whitespace(), 1),
            };
            if !space && !in_word {
                words += 1;
            }
            in_word = !space;
            i += width;
        }
        words
    }
}

/// Whether the escape after a backslash stands for ASCII whitespace, and the bytes it spans with
/// the backslash.
fn escape_is_space(rest: &[u8]) -> (bool, usize) {
    match rest.first() {
        Some(b'n' | b't' | b'r' | b'f') => (true, 2),
        Some(b'u') => {
            let hex = rest.get(1..5).and_then(|h| std::str::from_utf8(h).ok());
            let code = hex.and_then(|h| u32::from_str_radix(h, 16).ok());
            let space = matches!(code, Some(0x09 | 0x0a | 0x0c | 0x0d | 0x20));
            (space, 6)
        }
        _ => (false, 2),
    }
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
    pub fn user_text(text: &str) -> Self {
        Self::new(Arc::from(vec![Turn::from_text(Role::User, text)]), 1)
    }

    /// The turns this prompt sends, in order.
    pub fn turns(&self) -> &[Turn] {
        &self.turns[..self.len]
    }

    /// Bytes of (escaped) text in all turns, to size a body before writing it.
    pub fn text_bytes(&self) -> usize {
        self.turns().iter().map(|t| t.json.len()).sum()
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
            out.extend_from_slice(turn.json.as_bytes());
            out.push(b'}');
        }
        out.push(b']');
    }

    /// Every turn's text joined by a newline, as one JSON string: what a completions or
    /// `/generate` request sends. A later turn's prompt starts with an earlier turn's.
    pub fn write_flat_text(&self, out: &mut Vec<u8>) {
        out.push(b'"');
        for (i, turn) in self.turns().iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(b"\\n");
            }
            out.extend_from_slice(turn.escaped().as_bytes());
        }
        out.push(b'"');
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
        Arc::from(vec![
            Turn::from_text(Role::System, "be \"brief\""),
            Turn::from_text(Role::User, "hello"),
            Turn::from_json(Role::Assistant, r#""hi\nthere""#).unwrap(),
            Turn::from_text(Role::User, "again"),
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

    #[test]
    fn words_are_counted_on_the_escaped_text_as_on_the_text() {
        for text in [
            "",
            "one",
            "  two\twords ",
            "a\nb\r\nc",
            "quote \" and \\ back",
            "é\u{a0}x",
            "tab\u{9}x",
        ] {
            let turn = Turn::from_text(Role::User, text);
            assert_eq!(
                turn.words(),
                text.split_ascii_whitespace().count(),
                "{text:?}"
            );
            assert_eq!(turn.text(), text);
        }
        let escaped = Turn::from_json(Role::User, r#""a\u0020b\u00e9 c""#).unwrap();
        assert_eq!(escaped.words(), 3);
        assert!(Turn::from_json(Role::User, "42").is_none());
        let mut marked = Turn::from_text(Role::User, "x");
        marked.prefix_word("loop-2");
        assert_eq!(marked.text(), "loop-2 x");
    }
}
