//! The fast reader of a body's routing fields: one pass over the bytes that reads the fields the
//! router needs and skips every other value without decoding it.
//!
//! It reads exactly what the reference reader (`body`, `serde_json` visitors) reads, field by
//! field and shape by shape, and accepts no body that reader refuses. Where it is not sure it
//! hands the body over ([`Handoff`]) and the caller runs the reference reader instead, which
//! then gives the answer, an error's category and position included. A hand-over happens on:
//! - anything `serde_json` refuses (bad syntax, trailing bytes, a non-string `model`, bad
//!   escapes, invalid UTF-8 in a string the reader reads, nesting near its recursion limit);
//! - rare shapes it leaves to the reference: a lone surrogate escape in any string (the
//!   reference refuses it where it reads the string and accepts it where it skips it), a
//!   fraction, exponent or out-of-range integer where a number is read (`max_tokens`, partition
//!   values, `input_ids`), `input_ids` that are not all `u32` (mixed, negative, nested), values
//!   nested more than [`SKIP_DEPTH_MAX`] deep inside a skipped value.
//!
//! A hand-over costs at most this reader's partial pass on top of the reference reader's, so a
//! client sending such bodies on purpose gets no worse than the reference reader alone.
//!
//! Speed comes from three things: strings are scanned 16 bytes at a time for a quote, a
//! backslash or a control byte (a loop the compiler turns into vector compares) and skipped
//! strings are not UTF-8 validated (`serde_json` does not validate them either); text without
//! escapes is validated once and copied once; `input_ids` digits are converted eight bytes at a
//! time (SWAR), straight into the token buffer, and a long list of the common shape is read 64
//! bytes at a time: one pass finds every ID's first and last digit, so the IDs convert
//! independently of one another instead of each waiting for the one before to be measured.
//!
//! Where the text goes is [`TextMode`]'s choice: the input's reused buffer, or, for a large
//! body whose text the index keeps, nowhere during the pass: its strings are noted
//! ([`TextPiece`]) and decoded once after it, into the buffer the dispatch record keeps.

use std::borrow::Cow;
use std::sync::Arc;

use super::body::KeyFields;
use super::partition::RawPartition;
use super::{Endpoint, PartitionNamespace, RoutingInput};

/// The body is left to the reference reader (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Handoff;

type Step<T = ()> = Result<T, Handoff>;

/// Nesting along the values the reader visits beyond which it hands over (`serde_json`'s limit
/// there is 128).
const VISIT_DEPTH_MAX: u32 = 100;
/// Nesting inside one skipped value beyond which it hands over (the reference has no limit there).
const SKIP_DEPTH_MAX: u32 = 128;

/// Where the reader puts a prompt's text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TextMode {
    /// Decoded into the input's text buffer, kept between requests (the dispatch record then
    /// copies it): no allocation in the steady state.
    Reused,
    /// Built once, after the pass, in a new shared buffer that the dispatch record and the
    /// index keep as they are (`RoutingInput::shared_text`): a large body's text exists once
    /// besides the body.
    Shared,
}

/// A piece of prompt text in the body: the content of one non-empty string between its quotes,
/// checked by [`Scan::string`]; its UTF-8 is checked once, in the text [`shared_text`] builds.
#[derive(Clone, Copy, Debug)]
pub(super) struct TextPiece {
    start: usize,
    end: usize,
    escaped: bool,
}

/// Reads `body` into `input` (which the caller has cleared) and returns the partition namespace.
pub(super) fn read(
    endpoint: Endpoint,
    body: &[u8],
    key_fields: KeyFields,
    text_mode: TextMode,
    input: &mut RoutingInput,
) -> Result<PartitionNamespace, Handoff> {
    let mut scan = Scan {
        b: body,
        i: 0,
        scratch: std::mem::take(&mut input.scratch),
    };
    let read = scan.top(endpoint, key_fields, text_mode, input);
    input.scratch = scan.scratch;
    let partition = read?;
    if text_mode == TextMode::Shared {
        input.shared_text = shared_text(body, &input.system_pieces, &input.text_pieces)?;
    }
    Ok(partition)
}

/// The prompt text of [`TextMode::Shared`], built once where the dispatch record keeps it: the
/// pieces (the system prompt's first) decoded and joined with one space, as `push_text` and
/// `join_system_prompt` join them. `None` when there is no text. The pieces' UTF-8 is checked
/// here, by `text_key_written` over the whole text: joined by an ASCII space, the pieces are
/// UTF-8 each exactly when the whole is.
fn shared_text(body: &[u8], system: &[TextPiece], text: &[TextPiece]) -> Step<Option<Arc<str>>> {
    let pieces = || system.iter().chain(text);
    let Some(spaces) = (system.len() + text.len()).checked_sub(1) else {
        return Ok(None);
    };
    let mut len = spaces;
    for piece in pieces() {
        let raw = body.get(piece.start..piece.end).ok_or(Handoff)?;
        len += if piece.escaped {
            decoded_len(raw)?
        } else {
            raw.len()
        };
    }
    let written = crate::index::text_key_written(len, |out| {
        for (n, piece) in pieces().enumerate() {
            if n > 0 && !out.push(b" ") {
                return None;
            }
            let raw = body.get(piece.start..piece.end)?;
            if piece.escaped {
                decode_with(raw, |s| out.push(s.as_bytes()).then_some(()).ok_or(Handoff)).ok()?;
            } else if !out.push(raw) {
                return None;
            }
        }
        Some(())
    });
    written.map(Some).ok_or(Handoff)
}

/// A prompt text's destination for one field (see [`TextMode`]).
enum TextOut<'o> {
    /// Decoded, appended to a string.
    Decoded(&'o mut String),
    /// Noted as pieces of the body, for [`shared_text`].
    Pieces(&'o mut Vec<TextPiece>),
}

impl TextOut<'_> {
    /// At an opening quote: takes the string as one piece of the text (an empty one adds
    /// nothing); moves past it.
    fn push_string(&mut self, scan: &mut Scan<'_>) -> Step {
        match self {
            TextOut::Decoded(out) => scan.push_text(out),
            TextOut::Pieces(pieces) => {
                let start = scan.i + 1;
                let raw = scan.string()?;
                // Its UTF-8 is checked once, where the shared text is built (or, for a field
                // read again, where its pieces are dropped).
                if !raw.bytes.is_empty() {
                    pieces.push(TextPiece {
                        start,
                        end: start + raw.bytes.len(),
                        escaped: raw.escaped,
                    });
                }
                Ok(())
            }
        }
    }
}

impl<'o> TextOut<'o> {
    /// The string or the pieces `mode` writes to, emptied (a field read again replaces what it
    /// gave). Pieces are UTF-8 checked only as the shared text is built from them, so the ones
    /// dropped here are checked now: the reference reader refuses a body whose field, read
    /// first, held invalid UTF-8, even when it is read again.
    fn emptied(
        mode: TextMode,
        body: &[u8],
        text: &'o mut String,
        pieces: &'o mut Vec<TextPiece>,
    ) -> Step<Self> {
        Ok(match mode {
            TextMode::Reused => {
                text.clear();
                TextOut::Decoded(text)
            }
            TextMode::Shared => {
                for piece in pieces.drain(..) {
                    let bytes = body.get(piece.start..piece.end).ok_or(Handoff)?;
                    RawStr {
                        bytes,
                        escaped: piece.escaped,
                    }
                    .validate()?;
                }
                TextOut::Pieces(pieces)
            }
        })
    }
}

impl RoutingInput {
    /// The prompt text's destination, emptied.
    fn text_out(&mut self, mode: TextMode, body: &[u8]) -> Step<TextOut<'_>> {
        TextOut::emptied(mode, body, &mut self.text, &mut self.text_pieces)
    }

    /// The Messages API `system` prompt's destination, emptied.
    fn system_out(&mut self, mode: TextMode, body: &[u8]) -> Step<TextOut<'_>> {
        TextOut::emptied(mode, body, &mut self.system, &mut self.system_pieces)
    }
}

impl<'b> Scan<'b> {
    /// The body: one object, then nothing but whitespace.
    fn top(
        &mut self,
        endpoint: Endpoint,
        key_fields: KeyFields,
        text_mode: TextMode,
        input: &mut RoutingInput,
    ) -> Result<PartitionNamespace, Handoff> {
        let scan = self;
        if scan.ws() != Some(b'{') {
            return Err(Handoff);
        }
        let collect = key_fields == KeyFields::Read;
        let mut found = Found::default();
        scan.object(1, |scan, key| {
            top_field(scan, &key, endpoint, collect, text_mode, input, &mut found)
        })?;
        if scan.ws().is_some() {
            return Err(Handoff);
        }
        input.max_output_tokens = found.max_completion_tokens.or(found.max_tokens);
        Ok(found.partition.fields().namespace())
    }
}

/// What the pass found that is settled only at the body's end.
#[derive(Default)]
struct Found<'b> {
    partition: RawPartition<'b>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
}

/// One top-level entry; the cases and their conditions are the reference reader's, one for one.
fn top_field<'b>(
    scan: &mut Scan<'b>,
    key: &str,
    endpoint: Endpoint,
    collect: bool,
    text_mode: TextMode,
    input: &mut RoutingInput,
    found: &mut Found<'b>,
) -> Step {
    use Endpoint::{ChatCompletions, Completions, Generate, Messages};
    const DEPTH: u32 = 2;
    match key {
        "model" => {
            input.model.clear();
            match scan.peek() {
                Some(b'"') => scan.string_into(&mut input.model)?,
                Some(b'n') => scan.literal(b"null")?,
                _ => return Err(Handoff),
            }
        }
        "prompt" if collect && endpoint == Completions => {
            scan.first_text(DEPTH, &mut input.text_out(text_mode, scan.b)?)?;
        }
        "text" if collect && endpoint == Generate => {
            scan.first_text(DEPTH, &mut input.text_out(text_mode, scan.b)?)?;
        }
        "input_ids" if collect && endpoint == Generate => {
            scan.input_ids(DEPTH, &mut input.tokens)?;
        }
        "messages" if collect && matches!(endpoint, ChatCompletions | Messages) => {
            scan.message_list(DEPTH, &mut input.text_out(text_mode, scan.b)?)?;
        }
        "system" if collect && endpoint == Messages => {
            scan.content(DEPTH, &mut input.system_out(text_mode, scan.b)?)?;
        }
        "cache_salt" => found.partition.cache_salt = scan.lenient_str(DEPTH)?,
        "extra_key" => found.partition.extra_key = scan.lenient_str(DEPTH)?,
        "lora_path" => found.partition.lora_path = scan.lenient_str(DEPTH)?,
        "lora_id" if endpoint == Generate => found.partition.lora_id = scan.lenient_str(DEPTH)?,
        "max_tokens" if endpoint != Generate => found.max_tokens = scan.token_budget(DEPTH)?,
        "max_completion_tokens" if endpoint == ChatCompletions => {
            found.max_completion_tokens = scan.token_budget(DEPTH)?;
        }
        "sampling_params" if endpoint == Generate => {
            found.max_tokens = scan.sampling_params(DEPTH)?;
        }
        _ => scan.skip()?,
    }
    Ok(())
}

/// A string's content between its quotes, checked for control bytes and well-formed escapes (a
/// surrogate escape only as a whole pair); its UTF-8 is checked when it is read.
#[derive(Clone, Copy)]
struct RawStr<'b> {
    bytes: &'b [u8],
    escaped: bool,
}

impl<'b> RawStr<'b> {
    /// The string, borrowed when it has no escapes.
    fn to_cow(self) -> Step<Cow<'b, str>> {
        if self.escaped {
            let mut out = String::with_capacity(self.bytes.len());
            decode(self.bytes, &mut out)?;
            Ok(Cow::Owned(out))
        } else {
            std::str::from_utf8(self.bytes)
                .map(Cow::Borrowed)
                .map_err(|_| Handoff)
        }
    }

    /// Checks what reading the string checks (its UTF-8) without keeping it.
    fn validate(self) -> Step {
        if self.bytes.is_ascii() || std::str::from_utf8(self.bytes).is_ok() {
            Ok(())
        } else {
            Err(Handoff)
        }
    }
}

/// A number as `serde_json` hands it to a visitor that reads it.
enum Number {
    U64(u64),
    I64(i64),
}

/// The position in the body; every method that reads a value starts at its first byte (after
/// whitespace) and ends just past it.
struct Scan<'b> {
    b: &'b [u8],
    i: usize,
    /// Decoded strings with escapes, before their UTF-8 check (the input's, kept between
    /// requests).
    scratch: Vec<u8>,
}

impl<'b> Scan<'b> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// Skips JSON whitespace; the next byte, if any.
    fn ws(&mut self) -> Option<u8> {
        while let Some(&c) = self.b.get(self.i) {
            match c {
                b' ' | b'\n' | b'\r' | b'\t' => self.i += 1,
                _ => return Some(c),
            }
        }
        None
    }

    fn literal(&mut self, word: &[u8]) -> Step {
        match self.b.get(self.i..self.i + word.len()) {
            Some(found) if found == word => {
                self.i += word.len();
                Ok(())
            }
            _ => Err(Handoff),
        }
    }

    /// At an opening quote: the string's content; moves past the closing quote.
    fn string(&mut self) -> Step<RawStr<'b>> {
        let start = self.i + 1;
        let mut at = start;
        let mut escaped = false;
        loop {
            at = find_special(self.b, at);
            match self.b.get(at) {
                Some(b'"') => {
                    self.i = at + 1;
                    let bytes = self.b.get(start..at).ok_or(Handoff)?;
                    return Ok(RawStr { bytes, escaped });
                }
                Some(b'\\') => {
                    escaped = true;
                    at += escape_len(self.b, at)?;
                }
                // A control byte, or the end of the body.
                _ => return Err(Handoff),
            }
        }
    }

    /// At an opening quote: appends the string, decoded, to `out`; moves past the closing
    /// quote. A string without escapes is UTF-8 checked and copied once; one with escapes is
    /// decoded into the scratch buffer as its end is found, then checked whole and copied (as
    /// the reference reader does: a check per run between escapes costs more). On a hand-over
    /// `out` may hold part of it (the caller starts again).
    fn string_into(&mut self, out: &mut String) -> Step {
        let start = self.i + 1;
        let mut at = find_special(self.b, start);
        if self.b.get(at) == Some(&b'"') {
            let text = self.b.get(start..at).ok_or(Handoff)?;
            let text = std::str::from_utf8(text).map_err(|_| Handoff)?;
            crate::copy::push_str(out, text);
            self.i = at + 1;
            return Ok(());
        }
        self.scratch.clear();
        let mut run = start;
        loop {
            let text = self.b.get(run..at).ok_or(Handoff)?;
            if text.len() <= crate::copy::PIECE_BYTES {
                self.scratch.extend_from_slice(text);
            } else {
                crate::copy::extend_from_slice(&mut self.scratch, text);
            }
            match self.b.get(at) {
                Some(b'"') => {
                    self.i = at + 1;
                    let text = std::str::from_utf8(&self.scratch).map_err(|_| Handoff)?;
                    crate::copy::push_str(out, text);
                    return Ok(());
                }
                Some(b'\\') => {
                    // `\u` escapes are checked for surrogate pairs first; the one-letter ones
                    // are checked by `escape_char` itself.
                    if self.b.get(at + 1) == Some(&b'u') {
                        escape_len(self.b, at)?;
                    }
                    let (c, len) = escape_char(self.b, at)?;
                    if c.is_ascii() {
                        self.scratch.push(c as u8);
                    } else {
                        let mut utf8 = [0u8; 4];
                        self.scratch
                            .extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
                    }
                    at += len;
                    run = at;
                }
                // A control byte, or the end of the body.
                _ => return Err(Handoff),
            }
            at = find_special(self.b, at);
        }
    }

    /// At an opening quote: one piece of prompt text, one space between pieces (as the
    /// reference's `push_text`; an empty string adds nothing).
    fn push_text(&mut self, out: &mut String) -> Step {
        if self.b.get(self.i + 1) == Some(&b'"') {
            self.i += 2;
            return Ok(());
        }
        if !out.is_empty() {
            out.push(' ');
        }
        self.string_into(out)
    }

    /// At `-` or a digit: checks the number's grammar; `None` for a fraction, an exponent or an
    /// integer beyond `u64` / `i64` (what `serde_json` reads as a float).
    fn number(&mut self) -> Step<Option<Number>> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.i += 1;
        }
        let start = self.i;
        let mut value: Option<u64> = Some(0);
        while let Some(c @ b'0'..=b'9') = self.peek() {
            value = value
                .and_then(|v| v.checked_mul(10))
                .and_then(|v| v.checked_add(u64::from(c - b'0')));
            self.i += 1;
        }
        let digits = self.i - start;
        if digits == 0 || (digits > 1 && self.b.get(start) == Some(&b'0')) {
            return Err(Handoff);
        }
        let mut integer = true;
        if self.peek() == Some(b'.') {
            integer = false;
            self.i += 1;
            self.digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            integer = false;
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            self.digits()?;
        }
        Ok(match (integer, value, negative) {
            (true, Some(v), false) => Some(Number::U64(v)),
            // `serde_json` reads `-0` and anything below `i64::MIN` as floats.
            (true, Some(v), true) if (1..=1u64 << 63).contains(&v) => {
                Some(Number::I64((v as i64).wrapping_neg()))
            }
            _ => None,
        })
    }

    /// One or more digits.
    fn digits(&mut self) -> Step {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        if self.i == start {
            Err(Handoff)
        } else {
            Ok(())
        }
    }

    /// A number where the reference reads it: a float there is left to it.
    fn read_number(&mut self) -> Step<Number> {
        self.number()?.ok_or(Handoff)
    }

    /// Skips one value of any shape without reading it (the reference's `IgnoredAny`).
    fn skip(&mut self) -> Step {
        // One bit per open container: 1 for an object.
        let mut stack: u128 = 0;
        let mut depth: u32 = 0;
        'value: loop {
            match self.ws() {
                Some(b'"') => {
                    self.string()?;
                }
                Some(open @ (b'{' | b'[')) => {
                    self.i += 1;
                    if depth == SKIP_DEPTH_MAX {
                        return Err(Handoff);
                    }
                    stack = (stack << 1) | u128::from(open == b'{');
                    depth += 1;
                    let close = if open == b'{' { b'}' } else { b']' };
                    if self.ws() == Some(close) {
                        self.i += 1;
                        stack >>= 1;
                        depth -= 1;
                    } else {
                        if open == b'{' {
                            self.key_colon()?;
                        }
                        continue 'value;
                    }
                }
                Some(b't') => self.literal(b"true")?,
                Some(b'f') => self.literal(b"false")?,
                Some(b'n') => self.literal(b"null")?,
                Some(b'-' | b'0'..=b'9') => {
                    self.number()?;
                }
                _ => return Err(Handoff),
            }
            // After a value: close what ends here, then the next value or the end.
            loop {
                if depth == 0 {
                    return Ok(());
                }
                let in_object = stack & 1 == 1;
                match self.ws() {
                    Some(b',') => {
                        self.i += 1;
                        if in_object {
                            self.key_colon()?;
                        }
                        continue 'value;
                    }
                    Some(b']') if !in_object => {}
                    Some(b'}') if in_object => {}
                    _ => return Err(Handoff),
                }
                self.i += 1;
                stack >>= 1;
                depth -= 1;
            }
        }
    }

    /// A skipped object's key and its colon.
    fn key_colon(&mut self) -> Step {
        if self.ws() != Some(b'"') {
            return Err(Handoff);
        }
        self.string()?;
        if self.ws() != Some(b':') {
            return Err(Handoff);
        }
        self.i += 1;
        Ok(())
    }

    /// At `{` of an object the reference visits: `entry` reads each value (positioned at it) by
    /// its key, decoded and UTF-8 checked as the reference's key reader does.
    fn object(
        &mut self,
        depth: u32,
        mut entry: impl FnMut(&mut Self, Cow<'b, str>) -> Step,
    ) -> Step {
        if depth > VISIT_DEPTH_MAX {
            return Err(Handoff);
        }
        self.i += 1;
        if self.ws() == Some(b'}') {
            self.i += 1;
            return Ok(());
        }
        loop {
            if self.ws() != Some(b'"') {
                return Err(Handoff);
            }
            let key = self.string()?.to_cow()?;
            if self.ws() != Some(b':') {
                return Err(Handoff);
            }
            self.i += 1;
            if self.ws().is_none() {
                return Err(Handoff);
            }
            entry(self, key)?;
            match self.ws() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(Handoff),
            }
        }
    }

    /// At `[` of an array the reference visits: `element` reads each element (positioned at it)
    /// with its index.
    fn array(&mut self, depth: u32, mut element: impl FnMut(&mut Self, usize) -> Step) -> Step {
        if depth > VISIT_DEPTH_MAX {
            return Err(Handoff);
        }
        self.i += 1;
        if self.ws() == Some(b']') {
            self.i += 1;
            return Ok(());
        }
        let mut index = 0;
        loop {
            if self.ws().is_none() {
                return Err(Handoff);
            }
            element(self, index)?;
            index += 1;
            match self.ws() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(Handoff),
            }
        }
    }

    /// A value the reference reads with a visitor that ignores it: strings UTF-8 checked,
    /// numbers read, an array's elements skipped, an object's keys read and values skipped.
    fn read_ignored(&mut self, depth: u32) -> Step {
        match self.peek() {
            Some(b'"') => self.string()?.validate(),
            Some(b'[') => self.array(depth, |scan, _| scan.skip()),
            Some(b'{') => self.object(depth, |scan, _| scan.skip()),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.read_number().map(drop),
            _ => Err(Handoff),
        }
    }

    /// `prompt` / `text`: a string, or the first string of a batch (at any depth).
    fn first_text(&mut self, depth: u32, out: &mut TextOut<'_>) -> Step {
        match self.peek() {
            Some(b'"') => out.push_string(self),
            Some(b'[') => self.array(depth, |scan, index| {
                if index == 0 {
                    scan.first_text(depth + 1, out)
                } else {
                    scan.skip()
                }
            }),
            _ => self.read_ignored(depth),
        }
    }

    /// `messages`: each message's content, in order.
    fn message_list(&mut self, depth: u32, out: &mut TextOut<'_>) -> Step {
        match self.peek() {
            Some(b'[') => self.array(depth, |scan, _| scan.text_of("content", depth + 1, out)),
            _ => self.read_ignored(depth),
        }
    }

    /// An object whose field `name` holds content (a message's `content`, a part's `text`), or
    /// a bare string taken as text.
    fn text_of(&mut self, name: &str, depth: u32, out: &mut TextOut<'_>) -> Step {
        match self.peek() {
            Some(b'"') => out.push_string(self),
            Some(b'{') => self.object(depth, |scan, key| {
                if key == name {
                    scan.content(depth + 1, out)
                } else {
                    scan.skip()
                }
            }),
            _ => self.read_ignored(depth),
        }
    }

    /// Content: a string, or a list of parts whose `text` fields are taken in order.
    fn content(&mut self, depth: u32, out: &mut TextOut<'_>) -> Step {
        match self.peek() {
            Some(b'"') => out.push_string(self),
            Some(b'[') => self.array(depth, |scan, _| scan.text_of("text", depth + 1, out)),
            _ => self.read_ignored(depth),
        }
    }

    /// A partition value: a string, an integer's digits, or a batch's first such value.
    fn lenient_str(&mut self, depth: u32) -> Step<Option<Cow<'b, str>>> {
        match self.peek() {
            Some(b'"') => self.string()?.to_cow().map(Some),
            Some(b'-' | b'0'..=b'9') => Ok(Some(Cow::Owned(match self.read_number()? {
                Number::U64(v) => v.to_string(),
                Number::I64(v) => v.to_string(),
            }))),
            Some(b'[') => {
                let mut first = None;
                self.array(depth, |scan, index| {
                    if index == 0 {
                        first = scan.lenient_str(depth + 1)?;
                        Ok(())
                    } else {
                        scan.skip()
                    }
                })?;
                Ok(first)
            }
            _ => self.read_ignored(depth).map(|()| None),
        }
    }

    /// A token count: a non-negative integer that fits in a `u32`; anything else is none.
    fn token_budget(&mut self, depth: u32) -> Step<Option<u32>> {
        match self.peek() {
            Some(b'-' | b'0'..=b'9') => Ok(match self.read_number()? {
                Number::U64(v) => u32::try_from(v).ok(),
                Number::I64(v) => u32::try_from(v).ok(),
            }),
            _ => self.read_ignored(depth).map(|()| None),
        }
    }

    /// `/generate`'s `sampling_params`, read for its `max_new_tokens`.
    fn sampling_params(&mut self, depth: u32) -> Step<Option<u32>> {
        match self.peek() {
            Some(b'{') => {
                let mut budget = None;
                self.object(depth, |scan, key| {
                    if key == "max_new_tokens" {
                        budget = scan.token_budget(depth + 1)?;
                        Ok(())
                    } else {
                        scan.skip()
                    }
                })?;
                Ok(budget)
            }
            _ => self.read_ignored(depth).map(|()| None),
        }
    }

    /// `input_ids`: a flat list of IDs, or a batch routed on its first sequence. A value that is
    /// not a list is ignored (the IDs read so far stay, as in the reference); a list whose
    /// elements are not all `u32` IDs (or all sequences) is left to the reference.
    fn input_ids(&mut self, depth: u32, tokens: &mut Vec<u32>) -> Step {
        if self.peek() != Some(b'[') {
            return self.read_ignored(depth);
        }
        tokens.clear();
        self.i += 1;
        match self.ws() {
            Some(b']') => {
                self.i += 1;
                Ok(())
            }
            Some(b'[') => {
                self.i += 1;
                self.id_list(tokens)?;
                // The batch's other sequences are skipped, but each must be a sequence.
                loop {
                    match self.ws() {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(());
                        }
                        _ => return Err(Handoff),
                    }
                    if self.ws() != Some(b'[') {
                        return Err(Handoff);
                    }
                    self.skip()?;
                }
            }
            _ => self.id_list(tokens),
        }
    }

    /// Just after `[`: IDs up to and past the closing `]`, pushed onto `tokens`.
    fn id_list(&mut self, tokens: &mut Vec<u32>) -> Step {
        if self.ws() == Some(b']') {
            self.i += 1;
            return Ok(());
        }
        // IDs read one at a time before blocks are tried again (a list of another shape, such
        // as one ID per line, does not pay for a failed block at every ID).
        let mut read_alone = 0;
        loop {
            // The common case from one 8-byte load: an ID of 1-7 digits, then `,` or `]`; after
            // a comma, a block reads on while the list keeps that shape.
            if let Some(word) = load_word(self.b, self.i) {
                if let Some((id, len)) = word_id(word) {
                    tokens.push(id);
                    let byte = |n: usize| (word >> (8 * n)) as u8;
                    match byte(len) {
                        b',' => {
                            self.i += len;
                            if read_alone == 0 {
                                let comma = self.i;
                                self.i = ids_by_block(self.b, comma, tokens);
                                if self.i == comma {
                                    read_alone = IDS_READ_ALONE_AFTER_A_BLOCK_FAILS;
                                }
                            } else {
                                read_alone -= 1;
                            }
                            self.i += 1;
                            if let Some(b' ' | b'\n' | b'\r' | b'\t') = self.b.get(self.i) {
                                self.ws();
                            }
                            continue;
                        }
                        b']' => {
                            self.i += len + 1;
                            return Ok(());
                        }
                        b'.' | b'e' | b'E' => return Err(Handoff),
                        _ => self.i += len,
                    }
                } else {
                    self.slow_id(tokens)?;
                }
            } else {
                self.slow_id(tokens)?;
            }
            match self.ws() {
                Some(b',') => {
                    self.i += 1;
                    self.ws();
                }
                Some(b']') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(Handoff),
            }
        }
    }

    /// One ID read digit by digit (near the body's end, or of eight digits and more).
    fn slow_id(&mut self, tokens: &mut Vec<u32>) -> Step {
        let (id, len) = parse_id(self.b, self.i).ok_or(Handoff)?;
        tokens.push(id);
        self.i += len;
        Ok(())
    }
}

/// After a block of IDs that read nothing, how many IDs are read one at a time before the next.
const IDS_READ_ALONE_AFTER_A_BLOCK_FAILS: u32 = 16;

/// The bytes an ID block scans; it needs 8 more in the body, for the last ID's 8-byte load.
const ID_BLOCK_BYTES: usize = 64;

/// From `at`, the comma just after an ID: the IDs that follow, read [`ID_BLOCK_BYTES`] at a time
/// while they keep the common shape (1-7 digits, no leading zero, then a comma and at most one
/// space). Returns where it stopped: the comma after the last ID it read (`at` when none), so
/// whatever breaks the shape (the list's end, other whitespace, a long or malformed number) is
/// read by the general path, exactly as without blocks.
fn ids_by_block(b: &[u8], mut at: usize, tokens: &mut Vec<u32>) -> usize {
    loop {
        let stopped = id_block(b, at, tokens);
        if stopped == at {
            return at;
        }
        at = stopped;
    }
}

/// One block of [`ids_by_block`]: every byte's digit bit first, then each ID from its first and
/// last digit (the byte before the block's first, the comma at `at`, ends an ID).
fn id_block(b: &[u8], at: usize, tokens: &mut Vec<u32>) -> usize {
    let Some(bytes) = b.get(at..at + ID_BLOCK_BYTES + 8) else {
        return at;
    };
    let Ok(bytes) = <&[u8; ID_BLOCK_BYTES + 8]>::try_from(bytes) else {
        return at;
    };
    let mut digit = 0u64;
    for k in 0..ID_BLOCK_BYTES / 8 {
        digit |= digit_bits(block_word(bytes, 8 * k)) << (8 * k);
    }
    let after_digit = (digit << 1) | 1;
    // In order: each ID's first digit, and the byte after its last (IDs cut by the block's end
    // have a first digit only).
    let mut firsts = digit & !after_digit;
    let mut ends = !digit & after_digit & !1;
    let mut ids = [0u32; ID_BLOCK_BYTES / 2];
    let mut read = 0;
    let mut end = 0;
    while ends != 0 {
        let first = firsts.trailing_zeros() as usize;
        let stop = ends.trailing_zeros() as usize;
        let len = stop - first;
        let x = block_word(bytes, first) ^ ZEROS;
        let separator = (x >> (8 * (len & 7))) as u8 ^ (b',' ^ b'0');
        let gap = first - end;
        let common = len <= 7
            && (len == 1 || x & 0xFF != 0)
            && separator == 0
            && (gap == 1 || (gap == 2 && bytes[end + 1] == b' '));
        if !common {
            break;
        }
        // The digits moved to the top bytes: zero digits lead. (An ID and its comma take two
        // bytes at least, so `read` stays below the array's length; `%` spares the check.)
        ids[read % ids.len()] = eight_digits(x << (8 * (8 - len)));
        read += 1;
        end = stop;
        firsts &= firsts - 1;
        ends &= ends - 1;
    }
    tokens.extend_from_slice(&ids[..read.min(ids.len())]);
    at + end
}

/// The eight bytes of a block at `at` (below [`ID_BLOCK_BYTES`]), the first in the lowest byte.
fn block_word(bytes: &[u8; ID_BLOCK_BYTES + 8], at: usize) -> u64 {
    let at = at % ID_BLOCK_BYTES;
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// One bit per byte of `word` (the first byte's in bit 0): set where the byte is a digit.
fn digit_bits(word: u64) -> u64 {
    let digit_high = !not_digit_high(word ^ ZEROS) & HIGH;
    // The eight high bits gathered into the top byte, the first byte's lowest (no two partial
    // products land on the same bit, so nothing carries).
    (digit_high >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56
}

/// The high bit of each byte of `x` (a word XORed with [`ZEROS`]) that is not a digit: a value
/// above 9.
fn not_digit_high(x: u64) -> u64 {
    (((x & LOW7) + TEN_UP) | x) & HIGH
}

/// `'0'` in every byte of a word: XORed with it, digits become their values.
const ZEROS: u64 = 0x3030_3030_3030_3030;
const LOW7: u64 = 0x7F7F_7F7F_7F7F_7F7F;
const HIGH: u64 = 0x8080_8080_8080_8080;
/// Added to a byte's low seven bits, sets its high bit when they are 10 or more.
const TEN_UP: u64 = 0x7676_7676_7676_7676;

/// The eight bytes at `at`, the first in the lowest byte.
fn load_word(b: &[u8], at: usize) -> Option<u64> {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(b.get(at..at + 8)?);
    Some(u64::from_le_bytes(bytes))
}

/// The ID a word starts with and its length, when it has 1-7 digits (no leading zero) and the
/// next byte is in the word; `None` otherwise (the caller reads it byte by byte).
fn word_id(word: u64) -> Option<(u32, usize)> {
    // Each byte's digit value (0-9 for a digit, something else otherwise).
    let x = word ^ ZEROS;
    let not_digit = not_digit_high(x);
    let len = (not_digit.trailing_zeros() / 8) as usize;
    if len == 0 || len == 8 || (len > 1 && x & 0xFF == 0) {
        return None;
    }
    // Keep the digits and move them to the top bytes: leading zero digits.
    let digits = (x & ((1u64 << (8 * len)) - 1)) << (8 * (8 - len));
    Some((eight_digits(digits), len))
}

/// The position of the first quote, backslash or control byte at or after `from` (the body's
/// length if none). Checked in fixed-size chunks without an early exit inside, which the compiler
/// turns into vector compares: up to four chunks of 16 bytes (a key, a short value or a line of
/// text between two escapes ends there); past them, out of line, 64 bytes at a time (a prompt's
/// text: 2.3x faster than 16 at a time over 36 KB) and 16 at a time. The chunk that holds the
/// byte is then read eight bytes at a time ([`special_high`] finds the byte in a word), and the
/// body's last few bytes one at a time.
fn find_special(b: &[u8], from: usize) -> usize {
    const SHORT_CHUNKS: usize = 4;
    let chunks = b.get(from..).unwrap_or_default().chunks_exact(16);
    let plain = chunks
        .take(SHORT_CHUNKS)
        .take_while(|chunk| is_plain(chunk))
        .count();
    let mut at = from + plain * 16;
    if plain == SHORT_CHUNKS {
        at = skip_plain_text(b, at);
    }
    while let Some(word) = load_word(b, at) {
        let special = special_high(word);
        if special != 0 {
            return at + special.trailing_zeros() as usize / 8;
        }
        at += 8;
    }
    while let Some(&c) = b.get(at) {
        if is_special(c) {
            return at;
        }
        at += 1;
    }
    at
}

/// The high bit of each byte of `word` that is a quote, a backslash or a control byte. In each
/// term a byte's high bit is set when it is not that kind: its low seven bits plus the constant
/// reach the high bit (nothing carries into the next byte), or it had the bit already.
fn special_high(word: u64) -> u64 {
    let not_below = |x: u64, up: u64| ((x & LOW7) + up) | x;
    let not_quote = not_below(word ^ QUOTES, LOW7);
    let not_backslash = not_below(word ^ BACKSLASHES, LOW7);
    let not_control = not_below(word, CONTROL_UP);
    !(not_quote & not_backslash & not_control) & HIGH
}

/// A quote, and a backslash, in every byte of a word: XORed with it, those bytes become zero.
const QUOTES: u64 = 0x2222_2222_2222_2222;
const BACKSLASHES: u64 = 0x5C5C_5C5C_5C5C_5C5C;
/// Added to a byte's low seven bits, sets its high bit when they are 0x20 or more.
const CONTROL_UP: u64 = 0x6060_6060_6060_6060;

/// Past the plain chunks of a long string: 64 bytes at a time, then 16.
#[inline(never)]
fn skip_plain_text(b: &[u8], at: usize) -> usize {
    skip_plain::<16>(b, skip_plain::<64>(b, at))
}

/// Past the whole chunks of `N` bytes from `at` on that hold no quote, backslash or control byte.
fn skip_plain<const N: usize>(b: &[u8], mut at: usize) -> usize {
    for chunk in b.get(at..).unwrap_or_default().chunks_exact(N) {
        if !is_plain(chunk) {
            break;
        }
        at += N;
    }
    at
}

/// No byte of `chunk` ends or escapes a string, nor is a control byte (which a string may not
/// hold): every byte is looked at, so that the loop vectorizes.
#[inline(always)]
fn is_plain(chunk: &[u8]) -> bool {
    let mut hit = 0u8;
    for &c in chunk {
        hit |= u8::from(is_special(c));
    }
    hit == 0
}

/// A byte that ends or escapes a string, or a control byte.
fn is_special(c: u8) -> bool {
    (c == b'"') | (c == b'\\') | (c < 0x20)
}

/// The length of the escape at `at` (a backslash), checked: a known escape letter, four hex
/// digits after `u`, and a surrogate only as a high-low pair.
fn escape_len(b: &[u8], at: usize) -> Step<usize> {
    match b.get(at + 1) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(2),
        Some(b'u') => match hex4(b, at + 2)? {
            0xD800..=0xDBFF => {
                let pair = b.get(at + 6) == Some(&b'\\') && b.get(at + 7) == Some(&b'u');
                match hex4(b, at + 8) {
                    Ok(0xDC00..=0xDFFF) if pair => Ok(12),
                    _ => Err(Handoff),
                }
            }
            0xDC00..=0xDFFF => Err(Handoff),
            _ => Ok(6),
        },
        _ => Err(Handoff),
    }
}

fn hex4(b: &[u8], at: usize) -> Step<u32> {
    let digits = b.get(at..at + 4).ok_or(Handoff)?;
    digits.iter().try_fold(0u32, |acc, &c| {
        let digit = (c as char).to_digit(16).ok_or(Handoff)?;
        Ok(acc << 4 | digit)
    })
}

/// Appends a string's content with its escapes decoded (checked by [`Scan::string`]).
fn decode(raw: &[u8], out: &mut String) -> Step {
    out.reserve(raw.len());
    decode_with(raw, |text| {
        crate::copy::push_str(out, text);
        Ok(())
    })
}

/// The length of a string's content once its escapes are decoded.
fn decoded_len(raw: &[u8]) -> Step<usize> {
    let mut len = 0;
    decode_with(raw, |text| {
        len += text.len();
        Ok(())
    })?;
    Ok(len)
}

/// Hands `emit` a string's content, escapes decoded, in order: the runs between escapes and
/// each escape's character. The content is UTF-8 checked once, whole (escapes are ASCII, so
/// the text between them is too).
fn decode_with(raw: &[u8], mut emit: impl FnMut(&str) -> Step) -> Step {
    let text = std::str::from_utf8(raw).map_err(|_| Handoff)?;
    let mut at = 0;
    while at < raw.len() {
        let next = find_byte(raw, at, b'\\');
        if next > at {
            emit(text.get(at..next).ok_or(Handoff)?)?;
            at = next;
            continue;
        }
        let (c, len) = escape_char(raw, at)?;
        emit(c.encode_utf8(&mut [0; 4]))?;
        at += len;
    }
    Ok(())
}

/// The character an escape at `at` (a backslash, checked by [`escape_len`]) stands for, and
/// the escape's length.
fn escape_char(raw: &[u8], at: usize) -> Step<(char, usize)> {
    Ok(match raw.get(at + 1) {
        Some(b'"') => ('"', 2),
        Some(b'\\') => ('\\', 2),
        Some(b'/') => ('/', 2),
        Some(b'b') => ('\u{8}', 2),
        Some(b'f') => ('\u{c}', 2),
        Some(b'n') => ('\n', 2),
        Some(b'r') => ('\r', 2),
        Some(b't') => ('\t', 2),
        Some(b'u') => {
            let high = hex4(raw, at + 2)?;
            if (0xD800..=0xDBFF).contains(&high) {
                let low = hex4(raw, at + 8)?;
                let code = 0x1_0000 + ((high - 0xD800) << 10 | (low.wrapping_sub(0xDC00)));
                (char::from_u32(code).ok_or(Handoff)?, 12)
            } else {
                (char::from_u32(high).ok_or(Handoff)?, 6)
            }
        }
        _ => return Err(Handoff),
    })
}

/// The position of the first `byte` at or after `from` (the slice's length if none), sixteen
/// bytes at a time as [`find_special`] starts.
fn find_byte(b: &[u8], from: usize, byte: u8) -> usize {
    const CHUNK: usize = 16;
    let mut at = from;
    if let Some(rest) = b.get(from..) {
        for chunk in rest.chunks_exact(CHUNK) {
            let mut hit = 0u8;
            for &c in chunk {
                hit |= u8::from(c == byte);
            }
            if hit != 0 {
                break;
            }
            at += CHUNK;
        }
    }
    while let Some(&c) = b.get(at) {
        if c == byte {
            return at;
        }
        at += 1;
    }
    at
}

/// A token ID at `at`: its value and length in bytes, when it is an integer that fits in a
/// `u32` (no sign, fraction or exponent, no leading zero).
fn parse_id(b: &[u8], at: usize) -> Option<(u32, usize)> {
    let (value, len) = match load_word(b, at).and_then(word_id) {
        Some(found) => found,
        None => digit_by_digit(b, at)?,
    };
    if len > 1 && b.get(at) == Some(&b'0') {
        return None;
    }
    match b.get(at + len) {
        Some(b'.' | b'e' | b'E') => None,
        _ => Some((value, len)),
    }
}

/// Eight digit values, the first in the lowest byte, as one number (most significant first).
fn eight_digits(x: u64) -> u32 {
    const MASK: u64 = 0x0000_00FF_0000_00FF;
    const MUL1: u64 = 100 + (1_000_000 << 32);
    const MUL2: u64 = 1 + (10_000 << 32);
    let x = x.wrapping_mul(10).wrapping_add(x >> 8);
    let high = (x & MASK).wrapping_mul(MUL1);
    let low = ((x >> 16) & MASK).wrapping_mul(MUL2);
    (high.wrapping_add(low) >> 32) as u32
}

/// A token ID read digit by digit (near the body's end, or eight digits and more).
fn digit_by_digit(b: &[u8], at: usize) -> Option<(u32, usize)> {
    let mut value: u64 = 0;
    let mut len = 0;
    while let Some(c @ b'0'..=b'9') = b.get(at + len).copied() {
        value = value * 10 + u64::from(c - b'0');
        len += 1;
        if value > u64::from(u32::MAX) {
            return None;
        }
    }
    if len == 0 {
        return None;
    }
    Some((u32::try_from(value).ok()?, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_convert_like_the_standard_parser() {
        let cases = [
            "0",
            "7",
            "10",
            "99",
            "123",
            "4096",
            "12345",
            "127999",
            "1234567",
            "12345678",
            "99999999",
            "100000000",
            "4294967295",
        ];
        for digits in cases {
            let expected: u32 = digits.parse().unwrap();
            for tail in ["", ",", "]", " ,1", ",2,3,4,5,6,7,8"] {
                let body = format!("{digits}{tail}");
                assert_eq!(
                    parse_id(body.as_bytes(), 0),
                    Some((expected, digits.len())),
                    "{body}"
                );
            }
        }
        for refused in ["4294967296", "01", "1.5", "2e3", "-1", "x", "", ",1"] {
            let body = format!("{refused},0,0,0,0,0");
            assert_eq!(parse_id(body.as_bytes(), 0), None, "{refused}");
        }
    }

    #[test]
    fn special_high_marks_exactly_the_special_bytes() {
        for byte in 0..=255u8 {
            for at in 0..8 {
                // Neighbours just above and below each kind, and high bytes.
                let mut word = [b'!', b'#', b'[', b']', b' ', 0x7F, 0x80, 0xFF];
                word[at] = byte;
                let expected: u64 = (0..8)
                    .filter(|&i| is_special(word[i]))
                    .map(|i| 0x80 << (8 * i))
                    .sum();
                assert_eq!(
                    special_high(u64::from_le_bytes(word)),
                    expected,
                    "{byte} at {at}"
                );
            }
        }
    }

    #[test]
    fn find_special_finds_the_first_special_byte_at_every_distance() {
        // Every start and every distance to the byte through the 16-byte chunks, the 64-byte
        // ones and the word and byte tails, for each kind of special byte, and none at all.
        let reference = |b: &[u8], from: usize| {
            (from..b.len())
                .find(|&i| is_special(b[i]))
                .unwrap_or(b.len())
        };
        for special in [b'"', b'\\', 0x00, 0x1F] {
            for len in [0usize, 1, 7, 8, 15, 16, 17, 63, 64, 65, 80, 81, 200, 333] {
                for from in (0..len.min(20)).chain([len]) {
                    for place in std::iter::once(None).chain((from..len).map(Some)) {
                        let mut body = vec![b'a'; len];
                        body.iter_mut().step_by(3).for_each(|c| *c = 0xE2);
                        if let Some(at) = place {
                            body[at] = special;
                        }
                        assert_eq!(
                            find_special(&body, from),
                            reference(&body, from),
                            "{special} len {len} from {from} at {place:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn digit_bits_mark_exactly_the_digits() {
        for byte in 0..=255u8 {
            for at in 0..8 {
                let mut word = *b"ab:/.-x~";
                word[at] = byte;
                let expected = u64::from(byte.is_ascii_digit()) << at;
                assert_eq!(
                    digit_bits(u64::from_le_bytes(word)),
                    expected,
                    "{byte} at {at}"
                );
            }
        }
        for pattern in 0..=255u64 {
            let word: [u8; 8] = std::array::from_fn(|i| {
                if pattern >> i & 1 == 1 {
                    b'0' + i as u8
                } else {
                    b'/'
                }
            });
            assert_eq!(digit_bits(u64::from_le_bytes(word)), pattern);
        }
    }

    #[test]
    fn id_blocks_read_the_common_shape_and_stop_at_the_comma_before_anything_else() {
        let ids: Vec<String> = (0..60u32)
            .map(|i| (i * 7919 % 128_000).to_string())
            .collect();
        let parsed =
            |ids: &[String]| -> Vec<u32> { ids.iter().map(|id| id.parse().unwrap()).collect() };
        let padding = " ".repeat(100);
        for separator in [",", ", "] {
            let body = format!("[{}]{padding}", ids.join(separator));
            let comma = body.find(',').unwrap();
            let mut tokens = Vec::new();
            let stopped = ids_by_block(body.as_bytes(), comma, &mut tokens);
            assert!(tokens.len() > 40, "{separator:?}: {} IDs", tokens.len());
            assert_eq!(tokens, parsed(&ids[1..=tokens.len()]));
            assert_eq!(body.as_bytes()[stopped], b',');
            assert!(body[..stopped].ends_with(&ids[tokens.len()]));
        }
        // Whatever breaks the shape is left to the general path, from the comma before it.
        let breakers = [
            "\n7", "  7", "\t7", "01", "12345678", "1.5", "1e5", "-1", "x", "",
        ];
        for separator in [",", ", "] {
            for breaker in breakers {
                let mut items = ids.clone();
                items[10] = breaker.to_owned();
                let body = format!("[{}]{padding}", items.join(separator));
                let comma = body.find(',').unwrap();
                let mut tokens = Vec::new();
                let stopped = ids_by_block(body.as_bytes(), comma, &mut tokens);
                assert_eq!(
                    tokens,
                    parsed(&ids[1..10]),
                    "{breaker:?} after {separator:?}"
                );
                let before_breaker = body.find(&format!("{separator}{breaker}{separator}"));
                assert_eq!(
                    Some(stopped),
                    before_breaker,
                    "{breaker:?} after {separator:?}"
                );
            }
        }
        // Too near the body's end for a block: nothing read.
        let short = "[1,2,3]";
        let mut tokens = Vec::new();
        assert_eq!(ids_by_block(short.as_bytes(), 2, &mut tokens), 2);
        assert!(tokens.is_empty());
    }

    #[test]
    fn strings_end_at_the_first_unescaped_quote_and_refuse_control_bytes() {
        let body = br#""abcdefghijklmnopqrstuvwxyz \" 0123456789 \\" tail"#;
        let mut scan = Scan {
            b: body,
            i: 0,
            scratch: Vec::new(),
        };
        let raw = scan.string().unwrap();
        assert!(raw.escaped);
        assert_eq!(&body[scan.i..], b" tail");
        let mut out = String::new();
        decode(raw.bytes, &mut out).unwrap();
        assert_eq!(out, r#"abcdefghijklmnopqrstuvwxyz " 0123456789 \"#);
        for refused in [
            &b"\"a\nb\""[..],
            b"\"unterminated",
            b"\"\\x\"",
            b"\"\\ud800\"",
        ] {
            assert!(Scan {
                b: refused,
                i: 0,
                scratch: Vec::new(),
            }
            .string()
            .is_err());
        }
    }

    #[test]
    fn surrogate_pairs_decode_to_one_character() {
        let mut out = String::new();
        decode(br"a\ud83d\ude00b\u00e9", &mut out).unwrap();
        assert_eq!(out, "a\u{1F600}b\u{e9}");
    }
}
