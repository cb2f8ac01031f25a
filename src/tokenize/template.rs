//! [`ChatTemplate`]: a model's Jinja chat template, rendered the way Hugging Face `transformers`
//! renders it for the engines (`apply_chat_template`): `trim_blocks` and `lstrip_blocks`, the
//! `loopcontrols` extension, Python string and dict methods, HF's `tojson` (Python's
//! `json.dumps` with `ensure_ascii=False`: `", "` and `": "` separators, keys in the client's
//! order, no HTML escaping, floats as Python's `repr`), `raise_exception` and `strftime_now`;
//! `| trim` and the string methods `strip`, `lstrip`, `rstrip` and `split` without arguments
//! use Python's whitespace (`str.isspace`: Rust's `char::is_whitespace` and `\x1c`-`\x1f`). The context is HF's: the
//! messages, `tools` and `documents` (`none` when absent), `add_generation_prompt`, the special
//! tokens of `tokenizer_config.json` (`bos_token`, `eos_token`, ...) and the request's
//! `chat_template_kwargs`.
//!
//! Content parts: a template that loops over a message's `content` reads parts ("openai" content
//! format) and gets them as sent; any other template reads a string ("string" format), so an
//! array of parts is flattened first into the text of its `text` parts joined by `"\n"`, other
//! parts dropped: what vLLM does for such templates (and what SGLang's and SMG's detection
//! reproduce). A template error (a `raise_exception`, a type the template cannot handle) is a
//! [`TemplateError`]: the request then routes on its text, and the engine answers it.

use std::collections::BTreeMap;

use indexmap::IndexMap;
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde, ValueKind};
use minijinja::{Environment, ErrorKind, Value};
use serde_json::{json, Value as Json};

use super::concat;

/// The name the template is registered under (no extension: never HTML-escaped).
const TEMPLATE_NAME: &str = "chat";

/// How the template reads a message's `content`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentFormat {
    /// A string: arrays of parts are flattened before rendering.
    String,
    /// The list of parts as the client sent them (the template loops over `content`).
    OpenAi,
}

/// A template that failed to load or to render.
#[derive(Debug, thiserror::Error)]
#[error("chat template: {0}")]
pub struct TemplateError(String);

impl From<minijinja::Error> for TemplateError {
    fn from(err: minijinja::Error) -> Self {
        TemplateError(err.to_string())
    }
}

/// What one rendering reads besides the template, as the template's values (read from the
/// body straight into them: `prompt`).
#[derive(Debug, Default)]
pub struct ChatInput {
    /// The messages (OpenAI chat format): a list.
    pub messages: Value,
    /// Tool definitions, if the request has any.
    pub tools: Option<Value>,
    /// RAG documents, if the request has any.
    pub documents: Option<Value>,
    /// Whether the prompt ends with the assistant's header (the request's
    /// `add_generation_prompt`, true unless it says otherwise: the engines' default).
    pub add_generation_prompt: bool,
    /// The request's `chat_template_kwargs` (e.g. `enable_thinking`), passed as variables.
    pub kwargs: BTreeMap<String, Value>,
}

/// A compiled chat template and the special tokens it may print.
pub struct ChatTemplate {
    env: Environment<'static>,
    format: ContentFormat,
    /// `bos_token`, `eos_token`, ... from `tokenizer_config.json`.
    special_tokens: Vec<(String, String)>,
    /// Whether its printed sums are printed part by part (`concat`).
    sums_by_parts: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("format", &self.format)
            .field("special_tokens", &self.special_tokens)
            .field("sums_by_parts", &self.sums_by_parts)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `special_tokens` are the `*_token` entries of `tokenizer_config.json`.
    /// Its printed sums are printed part by part (`concat`) when that renders the probe
    /// conversations exactly as the template as written does.
    pub fn new(
        source: String,
        special_tokens: Vec<(String, String)>,
    ) -> Result<ChatTemplate, TemplateError> {
        let format = content_format(&source);
        let rewritten = concat::rewrite(&source);
        let as_written = ChatTemplate {
            env: environment(source)?,
            format,
            special_tokens,
            sums_by_parts: false,
        };
        let Some(Ok(env)) = rewritten.map(environment) else {
            return Ok(as_written);
        };
        let by_parts = ChatTemplate {
            env,
            format,
            special_tokens: as_written.special_tokens.clone(),
            sums_by_parts: true,
        };
        let same = probe_inputs().iter().all(|input| {
            match (as_written.render(input), by_parts.render(input)) {
                (Ok(a), Ok(b)) => a == b,
                (Err(_), Err(_)) => true,
                _ => false,
            }
        });
        Ok(if same { by_parts } else { as_written })
    }

    /// Whether its printed sums are printed part by part (see [`ChatTemplate::new`]).
    pub fn prints_sums_by_parts(&self) -> bool {
        self.sums_by_parts
    }

    /// How the template reads message content.
    pub fn content_format(&self) -> ContentFormat {
        self.format
    }

    /// Renders `input` into the prompt text the engine tokenizes.
    pub fn render(&self, input: &ChatInput) -> Result<String, TemplateError> {
        let template = self.env.get_template(TEMPLATE_NAME)?;
        let mut context: Vec<(String, Value)> =
            Vec::with_capacity(5 + self.special_tokens.len() + input.kwargs.len());
        for (name, token) in &self.special_tokens {
            context.push((name.clone(), Value::from(token.as_str())));
        }
        let messages = match self.format {
            ContentFormat::String => flatten_content_parts(&input.messages),
            ContentFormat::OpenAi => None,
        };
        context.push((
            "messages".into(),
            messages.unwrap_or_else(|| input.messages.clone()),
        ));
        let optional = |v: &Option<Value>| v.clone().unwrap_or(Value::from(()));
        context.push(("tools".into(), optional(&input.tools)));
        context.push(("documents".into(), optional(&input.documents)));
        context.push((
            "add_generation_prompt".into(),
            Value::from(input.add_generation_prompt),
        ));
        // Like transformers, the request's kwargs come last and win.
        for (name, value) in &input.kwargs {
            context.push((name.clone(), value.clone()));
        }
        // Later entries win, as in a Python dict built in this order.
        let context: BTreeMap<String, Value> = context.into_iter().collect();
        let context = Value::from(context);
        Ok(template.render(context)?)
    }
}

/// An environment that renders `source` as transformers does (see the module documentation).
fn environment(source: String) -> Result<Environment<'static>, TemplateError> {
    let mut env = Environment::new();
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()?;
    env.set_syntax(syntax);
    env.set_unknown_method_callback(python_methods);
    env.add_filter("trim", trim);
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_function(concat::FUNCTION, concat::concat);
    env.add_template_owned(TEMPLATE_NAME, source)?;
    Ok(env)
}

/// Conversations both forms of a template render at load (`ChatTemplate::new`): system, user,
/// assistant turns with and without reasoning and tool calls, tool results, tools, kwargs.
fn probe_inputs() -> Vec<ChatInput> {
    let messages = |list: Json| Value::from(Serde(list));
    let tool_call = json!([{"id": "c1", "type": "function",
        "function": {"name": "lookup", "arguments": "{\"q\": 1}"}}]);
    let tools = json!([{"type": "function", "function": {"name": "lookup",
        "description": "Finds things.", "parameters": {"type": "object", "properties": {}}}}]);
    vec![
        ChatInput {
            messages: messages(json!([
                {"role": "system", "content": "You are terse.\n"},
                {"role": "user", "content": "  Hi there "},
                {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello"},
                {"role": "user", "content": "Bye"},
            ])),
            add_generation_prompt: true,
            ..ChatInput::default()
        },
        ChatInput {
            messages: messages(json!([
                {"role": "user", "content": "find"},
                {"role": "assistant", "content": "", "tool_calls": tool_call},
                {"role": "tool", "content": "found"},
                {"role": "user", "content": "<tool_response>x</tool_response>"},
                {"role": "assistant", "content": "done"},
            ])),
            tools: Some(Value::from(Serde(&tools))),
            add_generation_prompt: false,
            kwargs: BTreeMap::from([("enable_thinking".to_owned(), Value::from(false))]),
            ..ChatInput::default()
        },
        ChatInput {
            messages: messages(json!([])),
            add_generation_prompt: true,
            ..ChatInput::default()
        },
    ]
}

/// "openai" when the template loops over a message's `content` (`for part in
/// message['content']`, `message.content`, or a variable named `content`), "string" otherwise:
/// the test vLLM's detection applies to the template's syntax tree, done on its text.
fn content_format(source: &str) -> ContentFormat {
    let mut rest = source;
    while let Some(at) = rest.find("for ") {
        let after = &rest[at + 4..];
        let statement_end = after.find("%}").unwrap_or(after.len());
        let statement = &after[..statement_end];
        if let Some(iterable) = statement.split(" in ").nth(1) {
            let iterable = iterable.trim().trim_end_matches('-').trim();
            let iterable = iterable.split('|').next().unwrap_or("").trim();
            if iterable.ends_with("content") || iterable.ends_with("['content']") {
                return ContentFormat::OpenAi;
            }
            if iterable.ends_with("[\"content\"]") {
                return ContentFormat::OpenAi;
            }
        }
        rest = after;
    }
    ContentFormat::String
}

/// The messages with every array `content` replaced by the text of its `text` parts joined by
/// `"\n"` (vLLM's flattening for string-format templates); `None` when no message has parts.
fn flatten_content_parts(messages: &Value) -> Option<Value> {
    let parts_of = |message: &Value| {
        let content = message.get_attr("content").ok()?;
        (content.kind() == ValueKind::Seq).then_some(content)
    };
    if messages.kind() != ValueKind::Seq {
        return None;
    }
    let list: Vec<Value> = messages.try_iter().ok()?.collect();
    if !list.iter().any(|message| parts_of(message).is_some()) {
        return None;
    }
    let flattened = list.into_iter().map(|message| {
        let Some(parts) = parts_of(&message) else {
            return message;
        };
        let texts: Vec<String> = parts
            .try_iter()
            .into_iter()
            .flatten()
            .filter_map(|part| match part.kind() {
                ValueKind::String => part.as_str().map(str::to_owned),
                ValueKind::Map if part.get_attr("type").ok()?.as_str() == Some("text") => {
                    part.get_attr("text").ok()?.as_str().map(str::to_owned)
                }
                _ => None,
            })
            .collect();
        with_content(&message, Value::from(texts.join("\n")))
    });
    Some(flattened.collect())
}

/// `message` (a map) with `content` set to `content`: in its place when the key is there, last
/// otherwise (as a JSON object's insert does, so `tojson` prints the keys in the same order).
pub(super) fn with_content(message: &Value, content: Value) -> Value {
    let mut fields: IndexMap<Value, Value> = message
        .try_iter()
        .into_iter()
        .flatten()
        .map(|key| {
            let value = message.get_item(&key).unwrap_or_default();
            (key, value)
        })
        .collect();
    fields.insert(Value::from("content"), content);
    Value::from_object(fields)
}

/// Python's `str.isspace()` for one character: Unicode's White_Space (Rust's
/// `char::is_whitespace`) plus the information separators `\x1c`-`\x1f`, which Python counts
/// (their bidirectional class is B or S) and Rust does not. Checked against Python over every
/// code point (`python_whitespace_is_rusts_and_the_separators`).
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\x1c'..='\x1f').contains(&c)
}

/// jinja2's `trim(value, chars=None)`: Python's `value.strip(chars)`.
fn trim(value: &str, chars: Option<&str>) -> String {
    match chars {
        Some(chars) => value.trim_matches(|c| chars.contains(c)).to_owned(),
        None => value.trim_matches(is_python_space).to_owned(),
    }
}

/// Python's string methods (`minijinja_contrib::pycompat`), except that `strip`, `lstrip` and
/// `rstrip` without characters and `split` without a separator use Python's whitespace.
fn python_methods(
    state: &mut minijinja::State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, minijinja::Error> {
    let without_args = args.iter().all(Value::is_none);
    match (value.as_str(), method) {
        (Some(s), "strip") if without_args => Ok(Value::from(s.trim_matches(is_python_space))),
        (Some(s), "lstrip") if without_args => {
            Ok(Value::from(s.trim_start_matches(is_python_space)))
        }
        (Some(s), "rstrip") if without_args => Ok(Value::from(s.trim_end_matches(is_python_space))),
        (Some(s), "split") if without_args => Ok(s
            .split(is_python_space)
            .filter(|part| !part.is_empty())
            .map(Value::from)
            .collect()),
        _ => minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args),
    }
}

/// HF's `tojson`: `json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    // ensure_ascii and separators are accepted; only their defaults are supported.
    let _: Option<Value> = kwargs.get("ensure_ascii")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, "tojson").with_source(e))?;
    let mut out = String::new();
    python_json(&json, indent, sort_keys.unwrap_or(false), 0, &mut out);
    Ok(Value::from(out))
}

/// Writes `value` as Python's `json.dumps` does (`ensure_ascii=False`): `", "` between items
/// and `": "` after keys on one line, or `","` and newlines indented by `indent` spaces.
fn python_json(
    value: &Json,
    indent: Option<usize>,
    sort_keys: bool,
    depth: usize,
    out: &mut String,
) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(width) = indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', width * depth));
        }
    };
    let separator = if indent.is_some() { "," } else { ", " };
    match value {
        Json::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(separator);
                }
                newline(out, depth + 1);
                python_json(item, indent, sort_keys, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Json::Object(map) if !map.is_empty() => {
            let mut entries: Vec<(&String, &Json)> = map.iter().collect();
            if sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(separator);
                }
                newline(out, depth + 1);
                out.push_str(&Json::String(key.clone()).to_string());
                out.push_str(": ");
                python_json(item, indent, sort_keys, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        Json::Number(number) if number.is_f64() => {
            python_float(number.as_f64().unwrap_or_default(), out)
        }
        // Other scalars, and empty containers (`[]`, `{}`), read the same in both.
        other => out.push_str(&other.to_string()),
    }
}

/// Writes `x` as Python's `repr(float)` (what `json.dumps` writes): the shortest digits that
/// read back as `x`, positional when the decimal exponent is from -4 to 15 (`0.0001`, `1.0`,
/// `1e+16` is the first beyond), otherwise `d.ddde±XX` with at least two exponent digits
/// (`1e-07`, `1.5e+300`). JSON has no infinities or NaN, so `x` is finite.
fn python_float(x: f64, out: &mut String) {
    use std::fmt::Write;
    // Rust's `{:e}` writes the same shortest digits: `-1.25e-7`.
    let scientific = format!("{x:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    out.push_str(sign);
    if !(-4..16).contains(&exponent) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let exponent_sign = if exponent < 0 { '-' } else { '+' };
        let _ = write!(out, "e{exponent_sign}{:02}", exponent.unsigned_abs());
    } else if exponent < 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-exponent - 1) as usize));
        out.push_str(&digits);
    } else {
        let point = exponent as usize + 1;
        if digits.len() > point {
            out.push_str(&digits[..point]);
            out.push('.');
            out.push_str(&digits[point..]);
        } else {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', point - digits.len()));
            out.push_str(".0");
        }
    }
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current UTC date and time in `format` (`%d %b %Y`, as Llama 3.x
/// templates use; `%d %m %y %Y %b %B %H %M %S %%`).
fn strftime_now(format: String) -> Result<Value, minijinja::Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(&format, secs).map(Value::from)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

fn strftime(format: &str, unix_secs: u64) -> Result<String, minijinja::Error> {
    let days = (unix_secs / 86_400) as i64;
    let (year, month, day) = civil_from_days(days);
    let secs_of_day = unix_secs % 86_400;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let month_name = MONTHS[(month - 1) as usize];
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('H') => out.push_str(&format!("{:02}", secs_of_day / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs_of_day / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs_of_day % 60)),
            Some('%') => out.push('%'),
            other => {
                let message = format!(
                    "strftime_now: unsupported directive %{}",
                    other.unwrap_or(' ')
                );
                return Err(minijinja::Error::new(ErrorKind::InvalidOperation, message));
            }
        }
    }
    Ok(out)
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::context;

    fn render(source: &str, messages: Json) -> String {
        let template = ChatTemplate::new(source.into(), vec![("bos_token".into(), "<s>".into())])
            .expect("compiles");
        let input = ChatInput {
            messages: Value::from(Serde(messages)),
            add_generation_prompt: true,
            ..ChatInput::default()
        };
        template.render(&input).expect("renders")
    }

    #[test]
    fn blocks_are_trimmed_like_transformers() {
        let source = "{{ bos_token }}{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}{% if add_generation_prompt %}>{% endif %}";
        let out = render(source, json!([{"role": "user", "content": "hi"}]));
        assert_eq!(out, "<s>[hi]\n>");
    }

    #[test]
    fn tojson_writes_python_json_dumps() {
        let source = "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}";
        let out = render(
            source,
            json!([{"z": [1, "é<&>"], "a": {"b": null, "e": []}}]),
        );
        assert_eq!(
            out,
            "{\"z\": [1, \"é<&>\"], \"a\": {\"b\": null, \"e\": []}}|{\n  \"z\": [\n    1,\n    \"é<&>\"\n  ],\n  \"a\": {\n    \"b\": null,\n    \"e\": []\n  }\n}"
        );
    }

    #[test]
    fn tojson_writes_floats_as_python_repr() {
        // Python: json.dumps([1e-7, 1e16, ...]) (the reference test checks a template's output).
        let floats = json!([
            1e-7,
            1e16,
            1.5e16,
            1e15,
            123456789012345.6,
            0.0001,
            0.00012,
            1e-5,
            1.0,
            -0.0,
            0.0,
            -2.5e-300,
            1.7976931348623157e308,
            5e-324,
            2.75,
            100.0,
            1e22,
            -1234.5678,
            0.30000000000000004
        ]);
        let mut out = String::new();
        python_json(&floats, None, false, 0, &mut out);
        assert_eq!(
            out,
            "[1e-07, 1e+16, 1.5e+16, 1000000000000000.0, 123456789012345.6, 0.0001, 0.00012, \
             1e-05, 1.0, -0.0, 0.0, -2.5e-300, 1.7976931348623157e+308, 5e-324, 2.75, 100.0, \
             1e+22, -1234.5678, 0.30000000000000004]"
        );
        // Integers stay integers.
        assert_eq!(render("{{ messages | tojson }}", json!([7, -3])), "[7, -3]");
    }

    #[test]
    fn python_whitespace_is_rusts_and_the_separators() {
        // Python: [c for c in range(0x110000) if chr(c).isspace()]
        let python: Vec<u32> = [0x9..=0xd, 0x1c..=0x20, 0x85..=0x85, 0xa0..=0xa0]
            .into_iter()
            .chain([
                0x1680..=0x1680,
                0x2000..=0x200a,
                0x2028..=0x2029,
                0x202f..=0x202f,
            ])
            .chain([0x205f..=0x205f, 0x3000..=0x3000])
            .flatten()
            .collect();
        let ours: Vec<u32> = (0..=0x10ffff_u32)
            .filter(|&c| char::from_u32(c).is_some_and(is_python_space))
            .collect();
        assert_eq!(ours, python);
    }

    #[test]
    fn trim_strip_and_split_use_python_whitespace() {
        let content = json!([{"content": "\x1c\u{2028} a\x1fb \u{85}\x1e"}]);
        let source = "[{{ messages[0].content | trim }}][{{ messages[0].content.strip() }}]\
                      [{{ messages[0].content.lstrip() }}][{{ messages[0].content.rstrip() }}]\
                      {{ messages[0].content.split() | length }}[{{ 'xxaxx' | trim('x') }}]\
                      [{{ 'xxaxx'.strip('x') }}]";
        assert_eq!(
            render(source, content),
            "[a\x1fb][a\x1fb][a\x1fb \u{85}\x1e][\x1c\u{2028} a\x1fb]2[a][a]"
        );
    }

    #[test]
    fn python_string_methods_and_exceptions() {
        let source = "{{ messages[0].content.split('/')[-1].lstrip('x') }}{% if messages[0].content.startswith('a') %}!{% endif %}";
        assert_eq!(render(source, json!([{"content": "a/xxb"}])), "b!");
        let failing = ChatTemplate::new("{{ raise_exception('no') }}".into(), vec![]).unwrap();
        assert!(failing.render(&ChatInput::default()).is_err());
    }

    #[test]
    fn content_parts_are_flattened_for_string_templates_only() {
        let messages = json!([{"role": "user", "content": [
            {"type": "text", "text": "one"}, {"type": "image_url", "image_url": {"url": "x"}},
            {"type": "text", "text": "two"}]}]);
        let string = "{% for m in messages %}{{ m.content }}{% endfor %}";
        assert_eq!(render(string, messages.clone()), "one\ntwo");
        let openai = "{% for m in messages %}{% for p in m['content'] %}({{ p.type }}){% endfor %}{% endfor %}";
        assert_eq!(content_format(openai), ContentFormat::OpenAi);
        assert_eq!(render(openai, messages), "(text)(image_url)(text)");
    }

    #[test]
    fn printed_sums_print_by_parts_as_plus_makes_them_whatever_the_operands() {
        let source = "{{ a + b }}|{{- a + b + c -}} | {{ a + 'x' + b | string }}";
        let as_written = environment(source.into()).expect("compiles");
        let by_parts = environment(concat::rewrite(source).expect("rewritten")).expect("compiles");
        let operands = [
            Value::from("s"),
            Value::from(""),
            Value::from(2),
            Value::from(1.5),
            Value::from(vec![Value::from(1)]),
            Value::from(()),
            Value::UNDEFINED,
            Value::from(true),
        ];
        let mut strings = 0;
        for a in &operands {
            for b in &operands {
                for c in &operands {
                    let render = |env: &Environment| {
                        let context = context! { a => a.clone(), b => b.clone(), c => c.clone() };
                        env.get_template(TEMPLATE_NAME)
                            .and_then(|t| t.render(context))
                            .map_err(|_| ())
                    };
                    let written = render(&as_written);
                    assert_eq!(written, render(&by_parts), "{a:?} {b:?} {c:?}");
                    strings += usize::from(written.is_ok_and(|w| w.contains("ss")));
                }
            }
        }
        assert!(strings > 0, "some sums are of strings");
    }

    #[test]
    fn a_qwen_style_template_prints_its_sums_by_parts() {
        let qwen_like = "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endfor %}";
        let template = ChatTemplate::new(qwen_like.into(), Vec::new()).expect("compiles");
        assert!(template.prints_sums_by_parts());
        let input = ChatInput {
            messages: Value::from(Serde(json!([{"role": "user", "content": "hi"}]))),
            ..ChatInput::default()
        };
        assert_eq!(
            template.render(&input).expect("renders"),
            "<|im_start|>user\nhi<|im_end|>\n"
        );
    }

    #[test]
    fn strftime_formats_dates() {
        // 2024-07-26 13:05:09 UTC
        assert_eq!(strftime("%d %b %Y", 1_721_999_109).unwrap(), "26 Jul 2024");
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %B %%", 1_721_999_109).unwrap(),
            "2024-07-26 13:05:09 July %"
        );
        assert!(strftime("%Q", 0).is_err());
    }
}
