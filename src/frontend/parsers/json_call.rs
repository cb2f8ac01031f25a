//! An incremental reader of one JSON tool call, `{"name": ..., "arguments": {...}}` (Llama's
//! `"parameters"` too), as its bytes arrive: it finds the name as soon as its string closes and
//! where the arguments' value begins, so their text can be streamed before the object ends.
//! It reads the structure (strings, escapes, nesting, the top-level keys), not every rule of
//! JSON: a scalar's spelling is the client's to judge, as the engines' parsers leave it.

use std::ops::Range;

/// What the reader expects next at the object's top level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Key,
    Colon,
    Value,
    /// Inside a number, `true`, `false` or `null`, until `,` or `}`.
    Scalar,
    Comma,
}

/// Which top-level key the value being read belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    Name,
    Arguments,
    Other,
}

/// How far the object's bytes have been read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scan {
    /// The object goes on.
    More,
    /// The object ended just before this offset.
    Done(usize),
    /// Not a JSON object here (at this offset).
    Invalid(usize),
}

/// The reader of one object, over a buffer the caller owns and only appends to.
#[derive(Debug)]
pub(super) struct JsonCall {
    /// The next byte to read.
    pos: usize,
    depth: u32,
    in_string: bool,
    escaped: bool,
    expect: Expect,
    key: Key,
    key_start: usize,
    /// Where the top-level value being read began.
    value_start: usize,
    /// The end of the last byte that is not whitespace outside a string.
    solid_end: usize,
    /// The function's name, once its string closed.
    pub(super) name: Option<String>,
    /// Where the arguments' value begins, and ends once it has.
    args_start: Option<usize>,
    args_end: Option<usize>,
}

impl JsonCall {
    /// A reader of the object whose `{` is at `start`.
    pub(super) fn new(start: usize) -> JsonCall {
        JsonCall {
            pos: start,
            depth: 0,
            in_string: false,
            escaped: false,
            expect: Expect::Key,
            key: Key::Other,
            key_start: start,
            value_start: start,
            solid_end: start,
            name: None,
            args_start: None,
            args_end: None,
        }
    }

    /// The arguments' text known so far (whitespace at its end held back, as it may end the
    /// value), or `None` before they begin.
    pub(super) fn args_known(&self) -> Option<Range<usize>> {
        let start = self.args_start?;
        Some(start..self.args_end.unwrap_or(self.solid_end.max(start)))
    }

    /// Whether the object had an arguments value.
    pub(super) fn has_args(&self) -> bool {
        self.args_start.is_some()
    }

    /// Reads what `buf` added since the last call.
    pub(super) fn scan(&mut self, buf: &str) -> Scan {
        let bytes = buf.as_bytes();
        while self.pos < bytes.len() {
            let at = self.pos;
            let b = bytes[at];
            self.pos += 1;
            if self.in_string {
                self.solid_end = at + 1;
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    if self.depth == 1 {
                        match self.expect {
                            Expect::Key => {
                                self.key = match &buf[self.key_start + 1..at] {
                                    "name" => Key::Name,
                                    "arguments" | "parameters" => Key::Arguments,
                                    _ => Key::Other,
                                };
                                self.expect = Expect::Colon;
                            }
                            _ => self.value_ended(buf, at + 1),
                        }
                    }
                }
                continue;
            }
            if b.is_ascii_whitespace() {
                continue;
            }
            self.solid_end = at + 1;
            if self.depth == 0 {
                if b != b'{' {
                    return Scan::Invalid(at);
                }
                self.depth = 1;
                continue;
            }
            if self.depth > 1 {
                match b {
                    b'"' => self.in_string = true,
                    b'{' | b'[' => self.depth += 1,
                    b'}' | b']' => {
                        self.depth -= 1;
                        if self.depth == 1 {
                            self.value_ended(buf, at + 1);
                        }
                    }
                    _ => {}
                }
                continue;
            }
            match (self.expect, b) {
                (Expect::Key, b'"') => {
                    self.key_start = at;
                    self.in_string = true;
                }
                (Expect::Colon, b':') => self.expect = Expect::Value,
                (Expect::Value, _) => {
                    self.value_start = at;
                    if self.key == Key::Arguments {
                        self.args_start = Some(at);
                    }
                    match b {
                        b'"' => self.in_string = true,
                        b'{' | b'[' => self.depth += 1,
                        b',' | b'}' | b']' | b':' => return Scan::Invalid(at),
                        _ => self.expect = Expect::Scalar,
                    }
                }
                (Expect::Scalar, b',' | b'}') => {
                    // The scalar ended at its last byte that was not whitespace before this.
                    let end = self.scalar_end(bytes, at);
                    self.value_ended(buf, end);
                    if b == b'}' {
                        return Scan::Done(at + 1);
                    }
                    self.expect = Expect::Key;
                }
                (Expect::Scalar, _) => {}
                (Expect::Comma, b',') => self.expect = Expect::Key,
                // `{}`, or a trailing comma's object (lenient, as Python's parsers of the
                // engines are not, but nothing is lost by it).
                (Expect::Comma | Expect::Key, b'}') => return Scan::Done(at + 1),
                _ => return Scan::Invalid(at),
            }
        }
        Scan::More
    }

    fn scalar_end(&self, bytes: &[u8], at: usize) -> usize {
        let mut end = at;
        while end > self.value_start && bytes[end - 1].is_ascii_whitespace() {
            end -= 1;
        }
        end
    }

    /// The top-level value that began at `value_start` ended before `end`.
    fn value_ended(&mut self, buf: &str, end: usize) {
        match self.key {
            Key::Name if self.name.is_none() => {
                self.name = serde_json::from_str::<String>(&buf[self.value_start..end]).ok();
            }
            Key::Arguments if self.args_end.is_none() => self.args_end = Some(end),
            _ => {}
        }
        self.expect = Expect::Comma;
    }
}
