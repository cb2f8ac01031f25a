//! A gRPC call's outcome: the `grpc-status` and `grpc-message` a worker sends in its trailers
//! (or alone, as a "trailers-only" response), and what each code means to the gateway. Owns
//! [`GrpcStatus`] and [`Code`]; [`Code::http_status`] is the status the client is answered with,
//! and through it the retry loop's reading: the codes that map to a retryable HTTP status (503
//! for `UNAVAILABLE`, 429 for `RESOURCE_EXHAUSTED`, 500s) are retried on another worker while no
//! byte reached the client, exactly as an HTTP worker's same answer would be.

use http::HeaderMap;

/// gRPC's status codes (the `grpc-status` trailer's value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// 0: the call succeeded.
    Ok,
    /// 1: the caller cancelled.
    Cancelled,
    /// 2: an error the server could not classify.
    Unknown,
    /// 3: the request is invalid whatever the server's state (a bad sampling field).
    InvalidArgument,
    /// 4: the deadline passed.
    DeadlineExceeded,
    /// 5: something the request names does not exist.
    NotFound,
    /// 6: it already exists.
    AlreadyExists,
    /// 7: not allowed.
    PermissionDenied,
    /// 8: out of some resource (the engine's queue or KV cache).
    ResourceExhausted,
    /// 9: the server is not in a state to run it.
    FailedPrecondition,
    /// 10: aborted (by the engine, e.g. an `Abort` call).
    Aborted,
    /// 11: out of range (a prompt longer than the context).
    OutOfRange,
    /// 12: the service or method is not served (the other engine's protocol).
    Unimplemented,
    /// 13: the server broke an invariant.
    Internal,
    /// 14: the server cannot take calls now: try another.
    Unavailable,
    /// 15: data lost.
    DataLoss,
    /// 16: no valid credentials.
    Unauthenticated,
}

impl Code {
    /// The code of a `grpc-status` value; an unknown number is `Unknown` (the spec's rule).
    pub fn from_number(number: u32) -> Code {
        const CODES: [Code; 17] = [
            Code::Ok,
            Code::Cancelled,
            Code::Unknown,
            Code::InvalidArgument,
            Code::DeadlineExceeded,
            Code::NotFound,
            Code::AlreadyExists,
            Code::PermissionDenied,
            Code::ResourceExhausted,
            Code::FailedPrecondition,
            Code::Aborted,
            Code::OutOfRange,
            Code::Unimplemented,
            Code::Internal,
            Code::Unavailable,
            Code::DataLoss,
            Code::Unauthenticated,
        ];
        CODES.get(number as usize).copied().unwrap_or(Code::Unknown)
    }

    /// The HTTP status a client is answered with for a call that ended so (the mapping of
    /// gRPC's HTTP gateways). `UNAVAILABLE` is 503 and `RESOURCE_EXHAUSTED` 429, which the
    /// retry loop retries on another worker while no byte reached the client; `CANCELLED` is
    /// nginx's 499 (the gateway cancels only for a client that went).
    pub fn http_status(self) -> u16 {
        match self {
            Code::Ok => 200,
            Code::Cancelled => 499,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        }
    }
}

/// How a call ended, as its trailers say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcStatus {
    /// `grpc-status`.
    pub code: Code,
    /// `grpc-message`, percent-decoded (empty when absent).
    pub message: String,
}

impl GrpcStatus {
    /// The status in `headers` (trailers, or a trailers-only response's headers); `None` when
    /// they carry no `grpc-status`. A value that is not a number reads as `UNKNOWN`.
    pub fn from_headers(headers: &HeaderMap) -> Option<GrpcStatus> {
        let value = headers.get("grpc-status")?;
        let code = std::str::from_utf8(value.as_bytes())
            .ok()
            .and_then(|text| text.trim().parse::<u32>().ok())
            .map_or(Code::Unknown, Code::from_number);
        let message = headers
            .get("grpc-message")
            .map(|m| percent_decode(m.as_bytes()))
            .unwrap_or_default();
        Some(GrpcStatus { code, message })
    }

    /// A status the gateway gives a call that ended without one.
    pub fn missing(why: &str) -> GrpcStatus {
        GrpcStatus {
            code: Code::Internal,
            message: why.to_string(),
        }
    }
}

/// `grpc-message` is percent-encoded UTF-8 (gRPC over HTTP/2); invalid escapes stay as sent.
fn percent_decode(value: &[u8]) -> String {
    let mut out = Vec::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        let escaped = (value[i] == b'%')
            .then(|| value.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(value[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trailers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn trailers_give_the_code_and_the_decoded_message() {
        let status = GrpcStatus::from_headers(&trailers(&[
            ("grpc-status", "14"),
            ("grpc-message", "engine%20busy%3A%20%E2%9C%93"),
        ]))
        .unwrap();
        assert_eq!(status.code, Code::Unavailable);
        assert_eq!(status.message, "engine busy: \u{2713}");
        let ok = GrpcStatus::from_headers(&trailers(&[("grpc-status", "0")])).unwrap();
        assert_eq!((ok.code, ok.message.as_str()), (Code::Ok, ""));
        assert_eq!(GrpcStatus::from_headers(&trailers(&[])), None);
        let odd =
            GrpcStatus::from_headers(&trailers(&[("grpc-status", "x"), ("grpc-message", "100%")]));
        assert_eq!(
            odd.map(|s| (s.code, s.message)),
            Some((Code::Unknown, "100%".into()))
        );
        assert_eq!(Code::from_number(99), Code::Unknown);
    }

    #[test]
    fn codes_map_to_the_statuses_the_retry_loop_reads() {
        use crate::workers::retry::is_retryable_status;
        let retried: Vec<Code> = (0..17)
            .map(Code::from_number)
            .filter(|code| is_retryable_status(code.http_status()))
            .collect();
        assert!(retried.contains(&Code::Unavailable));
        assert!(retried.contains(&Code::ResourceExhausted));
        assert!(!retried.contains(&Code::InvalidArgument));
        assert!(!retried.contains(&Code::Cancelled));
        assert_eq!(Code::InvalidArgument.http_status(), 400);
        assert_eq!(Code::Unavailable.http_status(), 503);
        assert_eq!(Code::ResourceExhausted.http_status(), 429);
    }
}
