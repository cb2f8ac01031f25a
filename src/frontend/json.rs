//! JSON pieces written by hand on the per-token path: a string's escaping and numbers, so a
//! chunk is one pass into the output buffer with no intermediate value.

/// Appends `text` as a JSON string (quotes included), escaped as `serde_json` escapes it.
pub fn push_str(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    push_escaped(out, text.as_bytes());
    out.push(b'"');
}

/// Appends `bytes` (UTF-8) escaped for the inside of a JSON string.
pub fn push_escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
}

/// Appends an unsigned integer.
pub fn push_u64(out: &mut Vec<u8>, value: u64) {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    let mut v = value;
    loop {
        at -= 1;
        buf[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[at..]);
}

/// Appends a float as `serde_json` writes it (`null` when not finite: JSON has no infinity; a
/// logprob of -inf is reported as the lowest finite value instead, as the engines do).
pub fn push_f32(out: &mut Vec<u8>, value: f32) {
    let value = if value == f32::NEG_INFINITY {
        -9999.0
    } else {
        value
    };
    match serde_json::to_writer(&mut *out, &value) {
        Ok(()) => {}
        Err(_) => out.extend_from_slice(b"null"),
    }
}

/// Appends a duration or other float as `serde_json` writes it (`null` when not finite).
pub fn push_f64(out: &mut Vec<u8>, value: f64) {
    if value.is_finite() && serde_json::to_writer(&mut *out, &value).is_ok() {
        return;
    }
    out.extend_from_slice(b"null");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_equals_serde_json() {
        for text in [
            "plain",
            "quote \" back \\ slash",
            "\n\r\t\u{8}\u{c}\u{1}\u{1f}",
            "日本 🎉",
            "",
        ] {
            let mut out = Vec::new();
            push_str(&mut out, text);
            assert_eq!(out, serde_json::to_vec(text).unwrap(), "{text:?}");
        }
        let mut out = Vec::new();
        for v in [0, 9, 10, 12345, u64::MAX] {
            out.clear();
            push_u64(&mut out, v);
            assert_eq!(out, v.to_string().into_bytes());
        }
    }
}
