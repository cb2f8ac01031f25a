//! The reference reader of a body's routing fields: `serde_json` drives hand-written visitors
//! that append text straight into the caller's buffers and skip every other value with
//! `IgnoredAny`. The gateway reads bodies with the faster `scan` first; this reader reads the
//! bodies `scan` hands over (invalid JSON, whose error it reports, and rare shapes) and is the
//! oracle `scan` is tested against (`equivalence.rs`): what it does is the specification.
//!
//! Shapes accepted (anything else in these fields is ignored, never an error):
//! - `prompt` (Completions) and `text` (`/generate`): a string, or a batch whose first string is used;
//! - `input_ids` (`/generate`): `[u32...]`, or a batch `[[u32...], ...]` routed on its first sequence;
//! - `messages` (Chat, Messages): each message's `content` string, or the `text` of its parts;
//! - `system` (Messages): a string or text blocks, placed before the messages by the caller;
//! - partition fields: strings, a batch's first string, or integers (`lora_id`).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::partition::RawPartition;
use super::{Endpoint, PartitionNamespace, RequestError, RoutingInput};

/// Whether the body's key fields (text, `input_ids`) are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KeyFields {
    /// Read them: the body supplies the routing key.
    Read,
    /// Skip them: a routing-tokens header already supplied the key.
    Skip,
}

/// Reads `body` into `input` and returns the request's partition namespace.
pub(super) fn read(
    endpoint: Endpoint,
    body: &[u8],
    key_fields: KeyFields,
    input: &mut RoutingInput,
) -> Result<PartitionNamespace, RequestError> {
    let mut partition = RawPartition::default();
    let mut de = serde_json::Deserializer::from_slice(body);
    let seed = BodySeed {
        endpoint,
        collect_key: key_fields == KeyFields::Read,
        input,
        partition: &mut partition,
    };
    let read = seed.deserialize(&mut de).and_then(|()| de.end());
    if let Err(err) = read {
        // Said first: serde_json calls a byte that is not UTF-8 a syntax error.
        if let Err(utf8) = std::str::from_utf8(body) {
            return Err(RequestError::InvalidUtf8 {
                offset: utf8.valid_up_to(),
            });
        }
        return Err(json_error(err));
    }
    Ok(partition.fields().namespace())
}

fn json_error(err: serde_json::Error) -> RequestError {
    let category = match err.classify() {
        serde_json::error::Category::Io => "io",
        serde_json::error::Category::Syntax => "syntax",
        serde_json::error::Category::Data => "data",
        serde_json::error::Category::Eof => "eof",
    };
    RequestError::MalformedJson {
        category,
        line: err.line(),
        column: err.column(),
    }
}

/// Appends one piece of prompt text, a single space between pieces (the sim-engine's tokenizer
/// joins chat messages the same way, so equal conversations give equal keys).
fn push_text(buf: &mut String, piece: &str) {
    if piece.is_empty() {
        return;
    }
    if !buf.is_empty() {
        buf.push(' ');
    }
    crate::copy::push_str(buf, piece);
}

/// Visitor methods that accept a value of the named JSON types (and `null`) and ignore it.
macro_rules! ignore_scalars {
    ($($method:ident($ty:ty)),* $(,)?) => {
        $(fn $method<E: de::Error>(self, _: $ty) -> Result<Self::Value, E> {
            Ok(Default::default())
        })*
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
    };
}

/// `visit_seq` that skips every element.
macro_rules! ignore_seq {
    () => {
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Default::default())
        }
    };
}

/// `visit_map` that skips every entry.
macro_rules! ignore_map {
    () => {
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(Default::default())
        }
    };
}

/// The top-level keys the router reads.
enum Field {
    Model,
    Prompt,
    Text,
    InputIds,
    Messages,
    System,
    CacheSalt,
    ExtraKey,
    LoraPath,
    LoraId,
    MaxTokens,
    MaxCompletionTokens,
    SamplingParams,
    Other,
}

impl<'de> de::Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_identifier(FieldVisitor)
    }
}

struct FieldVisitor;

impl Visitor<'_> for FieldVisitor {
    type Value = Field;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Field, E> {
        Ok(match key {
            "model" => Field::Model,
            "prompt" => Field::Prompt,
            "text" => Field::Text,
            "input_ids" => Field::InputIds,
            "messages" => Field::Messages,
            "system" => Field::System,
            "cache_salt" => Field::CacheSalt,
            "extra_key" => Field::ExtraKey,
            "lora_path" => Field::LoraPath,
            "lora_id" => Field::LoraId,
            "max_tokens" => Field::MaxTokens,
            "max_completion_tokens" => Field::MaxCompletionTokens,
            "sampling_params" => Field::SamplingParams,
            _ => Field::Other,
        })
    }
}

struct BodySeed<'a, 'de> {
    endpoint: Endpoint,
    collect_key: bool,
    input: &'a mut RoutingInput,
    partition: &'a mut RawPartition<'de>,
}

impl<'de> DeserializeSeed<'de> for BodySeed<'_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for BodySeed<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        use Endpoint::{ChatCompletions, Completions, Generate, Messages};
        let (endpoint, collect) = (self.endpoint, self.collect_key);
        let input = self.input;
        let (mut max_tokens, mut max_completion_tokens) = (None, None);
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Model => {
                    input.model.clear();
                    if let Some(model) = map.next_value::<ModelName<'de>>()?.0 {
                        input.model.push_str(&model);
                    }
                }
                Field::Prompt if collect && endpoint == Completions => {
                    input.text.clear();
                    map.next_value_seed(FirstText(&mut input.text))?;
                }
                Field::Text if collect && endpoint == Generate => {
                    input.text.clear();
                    map.next_value_seed(FirstText(&mut input.text))?;
                }
                Field::InputIds if collect && endpoint == Generate => {
                    map.next_value_seed(InputIds(&mut input.tokens))?;
                }
                Field::Messages if collect && matches!(endpoint, ChatCompletions | Messages) => {
                    input.text.clear();
                    map.next_value_seed(MessageList(&mut input.text))?;
                }
                Field::System if collect && endpoint == Messages => {
                    input.system.clear();
                    map.next_value_seed(Content(&mut input.system))?;
                }
                Field::CacheSalt => self.partition.cache_salt = map.next_value::<LenientStr>()?.0,
                Field::ExtraKey => self.partition.extra_key = map.next_value::<LenientStr>()?.0,
                Field::LoraPath => self.partition.lora_path = map.next_value::<LenientStr>()?.0,
                Field::LoraId if endpoint == Generate => {
                    self.partition.lora_id = map.next_value::<LenientStr>()?.0;
                }
                // `max_completion_tokens` supersedes `max_tokens` wherever each comes.
                Field::MaxTokens if endpoint != Generate => {
                    max_tokens = map.next_value::<TokenBudget>()?.0;
                }
                Field::MaxCompletionTokens if endpoint == ChatCompletions => {
                    max_completion_tokens = map.next_value::<TokenBudget>()?.0;
                }
                Field::SamplingParams if endpoint == Generate => {
                    max_tokens = map.next_value::<SamplingParams>()?.0;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        input.max_output_tokens = max_completion_tokens.or(max_tokens);
        Ok(())
    }
}

/// A token count: a non-negative integer that fits in a u32; anything else (null, a float, a
/// string, too large) is no budget, as the engine will judge it.
struct TokenBudget(Option<u32>);

impl<'de> de::Deserialize<'de> for TokenBudget {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(TokenBudgetVisitor)
            .map(TokenBudget)
    }
}

struct TokenBudgetVisitor;

impl<'de> Visitor<'de> for TokenBudgetVisitor {
    type Value = Option<u32>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a token count")
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
        Ok(u32::try_from(n).ok())
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
        Ok(u32::try_from(n).ok())
    }

    ignore_scalars!(visit_f64(f64), visit_str(&str), visit_bool(bool));
    ignore_seq!();
    ignore_map!();
}

/// `/generate`'s `sampling_params`, read for its `max_new_tokens`.
struct SamplingParams(Option<u32>);

impl<'de> de::Deserialize<'de> for SamplingParams {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(SamplingParamsVisitor)
            .map(SamplingParams)
    }
}

struct SamplingParamsVisitor;

impl<'de> Visitor<'de> for SamplingParamsVisitor {
    type Value = Option<u32>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of sampling parameters")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut budget = None;
        while let Some(key) = map.next_key::<SamplingField>()? {
            match key {
                SamplingField::MaxNewTokens => budget = map.next_value::<TokenBudget>()?.0,
                SamplingField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(budget)
    }

    ignore_scalars!(
        visit_u64(u64),
        visit_i64(i64),
        visit_f64(f64),
        visit_str(&str),
        visit_bool(bool)
    );
    ignore_seq!();
}

/// The keys of `sampling_params` the router reads.
enum SamplingField {
    MaxNewTokens,
    Other,
}

impl<'de> de::Deserialize<'de> for SamplingField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_identifier(SamplingFieldVisitor)
    }
}

struct SamplingFieldVisitor;

impl Visitor<'_> for SamplingFieldVisitor {
    type Value = SamplingField;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<SamplingField, E> {
        Ok(match key {
            "max_new_tokens" => SamplingField::MaxNewTokens,
            _ => SamplingField::Other,
        })
    }
}

/// A string-ish value: a string (borrowed when possible), a batch's first string, or an integer.
/// Anything else is `None`.
struct LenientStr<'de>(Option<Cow<'de, str>>);

impl<'de> de::Deserialize<'de> for LenientStr<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(LenientStrVisitor)
            .map(LenientStr)
    }
}

struct LenientStrVisitor;

impl<'de> Visitor<'de> for LenientStrVisitor {
    type Value = Option<Cow<'de, str>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Some(Cow::Borrowed(s)))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Some(Cow::Owned(s.to_owned())))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(Cow::Owned(v.to_string())))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Some(Cow::Owned(v.to_string())))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let first = seq.next_element::<LenientStr<'de>>()?.and_then(|s| s.0);
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(first)
    }

    ignore_scalars!(visit_bool(bool), visit_f64(f64));
    ignore_map!();
}

/// `model`: a string, or `null` (no model named). Anything else is a 400: read leniently as
/// other fields are, `"model": 5` became the model "5" and a 404 that blamed the catalog.
struct ModelName<'de>(Option<Cow<'de, str>>);

impl<'de> de::Deserialize<'de> for ModelName<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(ModelNameVisitor)
            .map(ModelName)
    }
}

struct ModelNameVisitor;

impl<'de> Visitor<'de> for ModelNameVisitor {
    type Value = Option<Cow<'de, str>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a model name (a string)")
    }

    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Some(Cow::Borrowed(s)))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Some(Cow::Owned(s.to_owned())))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// `prompt` / `text`: a string, or the first string of a batch.
struct FirstText<'a>(&'a mut String);

impl<'de> DeserializeSeed<'de> for FirstText<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FirstText<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a prompt")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        push_text(self.0, s);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        seq.next_element_seed(FirstText(self.0))?;
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    ignore_scalars!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_f64(f64)
    );
    ignore_map!();
}

/// `input_ids`: a flat list of IDs, or a batch whose first sequence is used. Any element that is
/// not a `u32` (or a mix of IDs and sequences) makes the field unusable: it is then ignored and
/// the request routes on its text.
struct InputIds<'a>(&'a mut Vec<u32>);

impl<'de> DeserializeSeed<'de> for InputIds<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for InputIds<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("token IDs")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let tokens = self.0;
        tokens.clear();
        let mut shape = IdsShape::Unknown;
        while let Some(element) = seq.next_element_seed(IdElement {
            tokens: &mut *tokens,
            batch_first: shape == IdsShape::Unknown,
        })? {
            shape = match (shape, element) {
                (IdsShape::Unknown | IdsShape::Flat, IdElementKind::Id) => IdsShape::Flat,
                (IdsShape::Unknown | IdsShape::Batch, IdElementKind::Sequence) => IdsShape::Batch,
                _ => IdsShape::Invalid,
            };
        }
        if shape == IdsShape::Invalid {
            tokens.clear();
        }
        Ok(())
    }

    ignore_scalars!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_f64(f64),
        visit_str(&str)
    );
    ignore_map!();
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum IdsShape {
    Unknown,
    Flat,
    Batch,
    Invalid,
}

#[derive(Clone, Copy, PartialEq, Eq, Default)]
enum IdElementKind {
    Id,
    Sequence,
    #[default]
    Invalid,
}

/// One element of `input_ids`: an ID (pushed), or a sequence (read when it is the batch's first).
struct IdElement<'a> {
    tokens: &'a mut Vec<u32>,
    batch_first: bool,
}

impl<'de> DeserializeSeed<'de> for IdElement<'_> {
    type Value = IdElementKind;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for IdElement<'_> {
    type Value = IdElementKind;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a token ID or a sequence of token IDs")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        match u32::try_from(v) {
            Ok(id) => {
                self.tokens.push(id);
                Ok(IdElementKind::Id)
            }
            Err(_) => Ok(IdElementKind::Invalid),
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        if !self.batch_first {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            return Ok(IdElementKind::Sequence);
        }
        let mut kind = IdElementKind::Sequence;
        while let Some(id) = seq.next_element::<TokenId>()? {
            match id.0 {
                Some(id) if kind == IdElementKind::Sequence => self.tokens.push(id),
                _ => kind = IdElementKind::Invalid,
            }
        }
        Ok(kind)
    }

    ignore_scalars!(
        visit_bool(bool),
        visit_i64(i64),
        visit_f64(f64),
        visit_str(&str)
    );
    ignore_map!();
}

/// One ID inside a batch sequence; `None` when it is not a `u32`.
struct TokenId(Option<u32>);

impl<'de> de::Deserialize<'de> for TokenId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(TokenIdVisitor).map(TokenId)
    }
}

struct TokenIdVisitor;

impl<'de> Visitor<'de> for TokenIdVisitor {
    type Value = Option<u32>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a token ID")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(u32::try_from(v).ok())
    }

    ignore_scalars!(
        visit_bool(bool),
        visit_i64(i64),
        visit_f64(f64),
        visit_str(&str)
    );
    ignore_seq!();
    ignore_map!();
}

/// `messages`: each message's content, in order.
struct MessageList<'a>(&'a mut String);

impl<'de> DeserializeSeed<'de> for MessageList<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MessageList<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of messages")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq
            .next_element_seed(TextOf("content", &mut *self.0))?
            .is_some()
        {}
        Ok(())
    }

    ignore_scalars!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_f64(f64),
        visit_str(&str)
    );
    ignore_map!();
}

/// An object whose field `.0` holds text (`Content`): a message's `content`, a part's `text`.
/// A bare string in place of the object is taken as text too.
struct TextOf<'a>(&'static str, &'a mut String);

impl<'de> DeserializeSeed<'de> for TextOf<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TextOf<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object with text")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        push_text(self.1, s);
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(is_text) = map.next_key_seed(KeyIs(self.0))? {
            if is_text {
                map.next_value_seed(Content(&mut *self.1))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }

    ignore_scalars!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_f64(f64)
    );
    ignore_seq!();
}

/// Content: a string, or a list of parts whose `text` fields are taken in order.
struct Content<'a>(&'a mut String);

impl<'de> DeserializeSeed<'de> for Content<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Content<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("message content")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<(), E> {
        push_text(self.0, s);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq
            .next_element_seed(TextOf("text", &mut *self.0))?
            .is_some()
        {}
        Ok(())
    }

    ignore_scalars!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_f64(f64)
    );
    ignore_map!();
}

/// A map key compared against one name, without allocating.
struct KeyIs(&'static str);

impl<'de> DeserializeSeed<'de> for KeyIs {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_identifier(self)
    }
}

impl Visitor<'_> for KeyIs {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}
