//! The `Date` header (RFC 9110 6.6.1) on the gateway's own answers and on worker answers that
//! carry none. Formatted at most once per second per thread (each data core, the control core),
//! never per response: a response reads the clock and copies the cached text.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

/// An IMF-fixdate's length: `Sun, 06 Nov 1994 08:49:37 GMT`.
const IMF_FIXDATE_BYTES: usize = 29;

/// This thread's date text and the Unix second it is for.
struct Cached {
    second: u64,
    text: [u8; IMF_FIXDATE_BYTES],
}

thread_local! {
    static CACHED: RefCell<Cached> = const {
        RefCell::new(Cached {
            second: u64::MAX,
            text: [0; IMF_FIXDATE_BYTES],
        })
    };
}

/// Appends `date: <IMF-fixdate>\r\n` for now.
pub fn write_date_header(out: &mut Vec<u8>) {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.second != second {
            // Years past 9999 do not fit the fixed form: no header rather than a wrong one.
            let Ok(text) =
                <[u8; IMF_FIXDATE_BYTES]>::try_from(httpdate::fmt_http_date(now).as_bytes())
            else {
                return;
            };
            *cached = Cached { second, text };
        }
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(&cached.text);
        out.extend_from_slice(b"\r\n");
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn date_of(out: &[u8]) -> SystemTime {
        let text = std::str::from_utf8(out).unwrap();
        let value = text
            .strip_prefix("date: ")
            .unwrap()
            .strip_suffix("\r\n")
            .unwrap();
        httpdate::parse_http_date(value).unwrap()
    }

    #[test]
    fn the_header_is_now_in_imf_fixdate_and_cached_per_second() {
        let before = SystemTime::now() - Duration::from_secs(1);
        let mut first = Vec::new();
        write_date_header(&mut first);
        let after = SystemTime::now() + Duration::from_secs(1);
        assert_eq!(first.len(), "date: ".len() + IMF_FIXDATE_BYTES + 2);
        let date = date_of(&first);
        assert!(before <= date && date <= after, "{date:?}");
        // Within one second the same text is copied, not formatted again.
        let second = CACHED.with(|c| c.borrow().second);
        let mut again = Vec::new();
        write_date_header(&mut again);
        if CACHED.with(|c| c.borrow().second) == second {
            assert_eq!(first, again);
        }
    }
}
