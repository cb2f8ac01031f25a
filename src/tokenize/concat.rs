//! Printed sums of strings, printed part by part. A template that prints
//! `{{ '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}` (Qwen's,
//! Llama's) builds the string one `+` at a time, and minijinja copies the growing string twice
//! per `+` (the concatenation, then into the value's own allocation): a 48 KB system prompt was
//! copied seven times, a fifth of a long chat's tokenization (`perf/results-tokenize.md`).
//!
//! [`rewrite`] turns, at load, each print statement whose whole expression is a sum of operands
//! into `{{ __kvgate_concat(a, b, ...) }}`. The function ([`concat`]) returns, when every operand
//! is a string (the only case where `+` concatenates), a value that prints the parts one after
//! the other, so each is copied once, into the output; otherwise it folds the operands with the
//! template's own `+`, left to right as written (numbers add, lists join, anything else fails
//! as it did). The operands are evaluated in the same order, once each, so the output is the
//! same; `ChatTemplate::new` also renders probe conversations with both templates and keeps the
//! original when they differ.
//!
//! The rewrite is conservative: only `{{ }}` statements, only operands with no operator at their
//! top level that binds looser than `+` or as loose, or might (`-`, `~`, comparisons, `not`,
//! `and`, `or`, `in`, `is`, `if`, a tuple's `,`); a template with a `raw` block is left as it is.

use std::fmt;
use std::sync::Arc;

use minijinja::value::{Object, ObjectRepr, Rest, ValueKind};
use minijinja::{context, Error, State, Value};

/// The function the rewritten statements call.
pub const FUNCTION: &str = "__kvgate_concat";

/// `source` with its printed sums calling [`FUNCTION`]; `None` when none was rewritten.
pub fn rewrite(source: &str) -> Option<String> {
    let mut out = String::with_capacity(source.len() + 256);
    let mut rest = source;
    let mut rewritten = false;
    while let Some(at) = rest.find('{') {
        let (text, tag) = rest.split_at(at);
        out.push_str(text);
        let Some(kind) = tag.as_bytes().get(1).copied() else {
            out.push_str(tag);
            return rewritten.then_some(out);
        };
        match kind {
            b'#' => {
                let end = tag.find("#}")? + 2;
                out.push_str(&tag[..end]);
                rest = &tag[end..];
            }
            b'%' => {
                let end = 2 + closing(&tag[2..], b'%')? + 2;
                let statement = tag[2..end - 2]
                    .trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
                if statement.starts_with("raw") {
                    return None;
                }
                out.push_str(&tag[..end]);
                rest = &tag[end..];
            }
            b'{' => {
                let end = 2 + closing(&tag[2..], b'}')? + 2;
                let inner = &tag[2..end - 2];
                let (open, expression, close) = split_modifiers(inner);
                match operands(expression) {
                    Some(parts) => {
                        out.push_str("{{");
                        out.push_str(open);
                        out.push(' ');
                        out.push_str(FUNCTION);
                        out.push('(');
                        out.push_str(&parts.join(", "));
                        out.push_str(") ");
                        out.push_str(close);
                        out.push_str("}}");
                        rewritten = true;
                    }
                    None => out.push_str(&tag[..end]),
                }
                rest = &tag[end..];
            }
            _ => {
                out.push('{');
                rest = &tag[1..];
            }
        }
    }
    out.push_str(rest);
    rewritten.then_some(out)
}

/// Where the tag's `X}` ends (`X` is `%` or `}`) in `body`, the text after its opening: the
/// first one outside a string literal and outside brackets.
fn closing(body: &str, mark: u8) -> Option<usize> {
    let bytes = body.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' | b'"' => i = string_end(bytes, i)?,
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' => depth = depth.checked_sub(1)?,
            b'}' if depth > 0 => depth -= 1,
            c if c == mark && depth == 0 && bytes.get(i + 1) == Some(&b'}') => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

/// The index of the quote closing the string literal that opens at `start`.
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let quote = bytes[start];
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 1,
            c if c == quote => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

/// A statement's whitespace modifiers (`-` or `+` against each delimiter) and its expression.
fn split_modifiers(inner: &str) -> (&str, &str, &str) {
    let open = if inner.starts_with(['-', '+']) { 1 } else { 0 };
    let close = if inner.len() > open && inner.ends_with(['-', '+']) {
        1
    } else {
        0
    };
    (
        &inner[..open],
        &inner[open..inner.len() - close],
        &inner[inner.len() - close..],
    )
}

/// The operands of `expression` when it is a sum of two or more of them, each of which reads
/// the same alone (see the module documentation); `None` otherwise.
fn operands(expression: &str) -> Option<Vec<&str>> {
    let bytes = expression.as_bytes();
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\'' | b'"' => i = string_end(bytes, i)?,
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.checked_sub(1)?,
            _ if depth > 0 => {}
            b'+' => {
                parts.push(expression[start..i].trim());
                start = i + 1;
            }
            b'-' | b'~' | b'<' | b'>' | b'=' | b'!' | b',' => return None,
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let word_end = bytes[i..]
                    .iter()
                    .position(|b| !(b.is_ascii_alphanumeric() || *b == b'_'))
                    .map_or(bytes.len(), |n| i + n);
                let after_dot = i > 0 && bytes[i - 1] == b'.';
                let word = &expression[i..word_end];
                let looser = ["not", "and", "or", "in", "is", "if", "else"];
                if !after_dot && looser.contains(&word) {
                    return None;
                }
                i = word_end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    if depth != 0 || parts.is_empty() {
        return None;
    }
    parts.push(expression[start..].trim());
    (!parts.iter().any(|part| part.is_empty())).then_some(parts)
}

/// [`FUNCTION`]: the sum of `parts` as `+` makes it (see the module documentation).
pub fn concat(state: &State, parts: Rest<Value>) -> Result<Value, Error> {
    let parts = parts.0;
    if parts.iter().all(|part| part.kind() == ValueKind::String) {
        return Ok(Value::from_object(Printed(parts)));
    }
    let add = state.env().compile_expression("left + right")?;
    let mut parts = parts.into_iter();
    let mut sum = parts.next().unwrap_or_default();
    for right in parts {
        sum = add.eval(context! { left => sum, right })?;
    }
    Ok(sum)
}

/// Strings that print one after the other.
#[derive(Debug)]
struct Printed(Vec<Value>);

impl Object for Printed {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0
            .iter()
            .try_for_each(|part| f.write_str(part.as_str().unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_printed_sum_calls_the_function_and_keeps_its_modifiers() {
        let source = "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m['content'] | trim + '}}' -}}\n{% endfor %}";
        let expected = format!(
            "{{%- for m in messages %}}{{{{- {FUNCTION}('<|im_start|>', m.role, '\\n', m['content'] | trim, '}}}}') -}}}}\n{{% endfor %}}"
        );
        assert_eq!(rewrite(source).as_deref(), Some(expected.as_str()));
    }

    #[test]
    fn what_binds_looser_than_plus_is_left_alone() {
        for expression in [
            "{{ a + b - c }}",
            "{{ a + b ~ c }}",
            "{{ a + b if c else d }}",
            "{{ a + b == c }}",
            "{{ a + b in c }}",
            "{{ a + b is string }}",
            "{{ not a + b }}",
            "{{ a or b + c }}",
            "{{ a + }}",
            "{{ a + b, c }}",
            "{{ a }}",
            "{{ (a + b) | trim }}",
            "{# {{ a + b }} #}",
            "{% set x = a + b %}",
            "{% raw %}{% endraw %}{{ a + b }}",
        ] {
            assert_eq!(rewrite(expression), None, "{expression}");
        }
        // Inside brackets and strings, and after a dot, anything goes.
        let kept = rewrite("{{ a[i - 1] + 'x - y' + m.is + f(not b) }}").unwrap();
        assert!(
            kept.contains("(a[i - 1], 'x - y', m.is, f(not b))"),
            "{kept}"
        );
    }
}
