//! The `x-smg-routing-tokens` hint: the prompt's leading token IDs as comma-separated decimals.
//! A value over either bound, empty, or with anything but `[0-9]` digits between commas (ASCII
//! spaces around an ID are tolerated) is ignored as a whole, never an error.

/// The most IDs the hint may carry (SMG's bound: enough leading pages to route on).
pub const ROUTING_TOKENS_IDS_MAX: usize = 512;
/// The most bytes the hint's value may have (SMG's bound; keeps header parsing cheap).
pub const ROUTING_TOKENS_BYTES_MAX: usize = 4096;

/// Parses a hint value into `out` (cleared first). Returns false, leaving `out` empty, when the
/// value is not a valid hint.
pub fn parse_routing_tokens(value: &[u8], out: &mut Vec<u32>) -> bool {
    out.clear();
    if value.is_empty() || value.len() > ROUTING_TOKENS_BYTES_MAX {
        return false;
    }
    for item in value.split(|&b| b == b',') {
        let Some(id) = parse_token_id(item.trim_ascii()) else {
            out.clear();
            return false;
        };
        if out.len() == ROUTING_TOKENS_IDS_MAX {
            out.clear();
            return false;
        }
        out.push(id);
    }
    true
}

/// One decimal `u32`, digits only (no sign, no empty string).
fn parse_token_id(digits: &[u8]) -> Option<u32> {
    if digits.is_empty() {
        return None;
    }
    let mut id: u32 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        id = id.checked_mul(10)?.checked_add(u32::from(b - b'0'))?;
    }
    Some(id)
}
