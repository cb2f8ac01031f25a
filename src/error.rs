//! The gateway's two error types, leaves every layer may use.
//!
//! - [`ProxyError`], the one error of anything that speaks HTTP to a client or a worker: its kind,
//!   the side at fault (downstream client, upstream worker, or the gateway itself), whether a
//!   retry on another upstream attempt is allowed, and the cause. Each [`ErrorKind`] knows its
//!   HTTP status, its OpenAI-style error type and whether the client connection can be kept after
//!   answering it, so turning an error into a response is one table lookup.
//! - [`FlagError`], the one error of flag validation: it names the flag and says what is wrong
//!   with its value; `main` prints it as one `Error: ...` line and exits non-zero.

use std::fmt;
use std::io;

/// Which side of the proxy an error came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The client.
    Downstream,
    /// The engine worker.
    Upstream,
    /// The gateway.
    Internal,
}

/// Whether the retry loop may try again after this error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Answer the client with this error.
    No,
    /// Nothing of the request reached a worker, or the worker dropped it unanswered: try again,
    /// preferably on another worker.
    Allowed,
}

/// What went wrong; each kind maps to one status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is not valid HTTP/1.1.
    MalformedRequest,
    /// The request head exceeds `HEADER_BYTES_MAX` or `HEADERS_MAX`.
    HeadersTooLarge,
    /// The body exceeds `--max-payload-size`.
    PayloadTooLarge,
    /// No bearer token, or the wrong one, where one is required (answered with
    /// `WWW-Authenticate: Bearer`).
    Unauthorized,
    /// An admin call while the admin API is closed (no `--admin-api-key`, no
    /// `--admin-api-insecure`): `workers::admin::check_access`'s refusal, as `Unauthorized` is
    /// its refusal of a call without the key.
    AdminClosed,
    /// The request already passed through this gateway (its `Via` carries our pseudonym): a
    /// worker URL leads back here, and forwarding again would loop.
    LoopDetected,
    /// A routed endpoint got a body that is not JSON.
    InvalidJson,
    /// No endpoint at this path.
    NotFound,
    /// No worker serves the request's `model` (from the workers' `/v1/models`).
    ModelNotFound,
    /// The endpoint exists but not for this method.
    MethodNotAllowed,
    /// The client was too slow to send its request.
    RequestTimeout,
    /// The client went away.
    ClientClosed,
    /// No healthy worker to route to.
    NoHealthyWorker,
    /// The data core holds `--max-inflight-body-bytes-per-core` of request bodies already.
    BodyBudgetExceeded,
    /// The gateway is shutting down: a new request on an open connection, or one still waiting
    /// on its worker when `--shutdown-grace-period-secs` ran out.
    ShuttingDown,
    /// Connecting to the worker failed.
    UpstreamConnect,
    /// The worker closed or reset the connection before answering in full.
    UpstreamClosed,
    /// The worker's answer is not valid HTTP/1.1.
    UpstreamMalformed,
    /// The worker did not answer within `--request-timeout-secs` or
    /// `--upstream-first-byte-timeout-secs`, or fell silent past `--upstream-idle-timeout-secs`.
    UpstreamTimeout,
    /// A bug or resource failure in the gateway.
    Internal,
}

impl ErrorKind {
    /// The HTTP status answered for this kind.
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::MalformedRequest | ErrorKind::InvalidJson => 400,
            ErrorKind::Unauthorized => 401,
            ErrorKind::AdminClosed => 403,
            ErrorKind::NotFound | ErrorKind::ModelNotFound => 404,
            ErrorKind::MethodNotAllowed => 405,
            ErrorKind::RequestTimeout => 408,
            ErrorKind::PayloadTooLarge => 413,
            ErrorKind::HeadersTooLarge => 431,
            ErrorKind::ClientClosed => 499,
            ErrorKind::Internal => 500,
            ErrorKind::UpstreamConnect
            | ErrorKind::UpstreamClosed
            | ErrorKind::UpstreamMalformed => 502,
            ErrorKind::NoHealthyWorker
            | ErrorKind::ShuttingDown
            | ErrorKind::BodyBudgetExceeded => 503,
            ErrorKind::UpstreamTimeout => 504,
            ErrorKind::LoopDetected => 508,
        }
    }

    /// The OpenAI-style `error.type` of the JSON body.
    pub fn error_type(self) -> &'static str {
        match self {
            ErrorKind::MalformedRequest
            | ErrorKind::HeadersTooLarge
            | ErrorKind::PayloadTooLarge
            | ErrorKind::InvalidJson
            | ErrorKind::MethodNotAllowed
            | ErrorKind::RequestTimeout
            | ErrorKind::ClientClosed => "invalid_request_error",
            ErrorKind::NotFound | ErrorKind::ModelNotFound => "not_found_error",
            ErrorKind::Unauthorized => "authentication_error",
            ErrorKind::AdminClosed => "forbidden",
            ErrorKind::LoopDetected => "loop_detected",
            ErrorKind::NoHealthyWorker
            | ErrorKind::ShuttingDown
            | ErrorKind::BodyBudgetExceeded => "service_unavailable",
            ErrorKind::UpstreamConnect
            | ErrorKind::UpstreamClosed
            | ErrorKind::UpstreamMalformed => "bad_gateway",
            ErrorKind::UpstreamTimeout => "gateway_timeout",
            ErrorKind::Internal => "internal_error",
        }
    }

    /// The default message of the JSON body.
    pub fn message(self) -> &'static str {
        match self {
            ErrorKind::MalformedRequest => "malformed HTTP request",
            ErrorKind::HeadersTooLarge => "request headers too large",
            ErrorKind::PayloadTooLarge => "request body exceeds --max-payload-size",
            ErrorKind::InvalidJson => {
                "request body is not valid JSON, or a field has the wrong type (model: a string)"
            }
            ErrorKind::Unauthorized => {
                "missing or wrong Authorization: Bearer token (--api-key; on the admin API, \
                 --admin-api-key)"
            }
            ErrorKind::AdminClosed => {
                "the admin API is disabled: start kvgate with --admin-api-key (bearer token) or \
                 --admin-api-insecure"
            }
            ErrorKind::LoopDetected => {
                "the request already passed through this gateway (Via): a worker URL leads back \
                 to it"
            }
            ErrorKind::NotFound => "no such endpoint",
            ErrorKind::ModelNotFound => {
                "the requested model is not served by any worker (see GET /v1/models)"
            }
            ErrorKind::MethodNotAllowed => "method not allowed on this endpoint",
            ErrorKind::RequestTimeout => "request not received in time",
            ErrorKind::ClientClosed => "client closed the connection",
            ErrorKind::NoHealthyWorker => "no healthy worker available",
            ErrorKind::ShuttingDown => "the gateway is shutting down",
            ErrorKind::BodyBudgetExceeded => {
                "the gateway holds too many request bodies at once; retry later"
            }
            ErrorKind::UpstreamConnect => "could not connect to any worker",
            ErrorKind::UpstreamClosed => "worker closed the connection",
            ErrorKind::UpstreamMalformed => "worker sent a malformed response",
            ErrorKind::UpstreamTimeout => {
                "worker did not answer in time (--upstream-first-byte-timeout-secs, --request-timeout-secs)"
            }
            ErrorKind::Internal => "internal gateway error",
        }
    }

    /// Whether the client connection may serve another request after this error's answer.
    /// Parse-level errors leave the stream position unknown, so they close.
    pub fn keeps_connection(self) -> bool {
        !matches!(
            self,
            ErrorKind::MalformedRequest
                | ErrorKind::HeadersTooLarge
                | ErrorKind::PayloadTooLarge
                | ErrorKind::RequestTimeout
                | ErrorKind::ClientClosed
                | ErrorKind::ShuttingDown
                | ErrorKind::BodyBudgetExceeded
        )
    }

    /// Whether the client should get an answer at all (not if it is gone).
    pub fn answers_client(self) -> bool {
        self != ErrorKind::ClientClosed
    }
}

/// The data path's error: kind, side, retry permission, cause and context.
#[derive(Debug)]
pub struct ProxyError {
    /// What went wrong.
    pub kind: ErrorKind,
    /// Who is at fault.
    pub side: Side,
    /// Whether the retry loop may try again.
    pub retry: Retry,
    /// The underlying I/O error, if any.
    pub cause: Option<io::Error>,
    /// Where it happened (a fixed phrase, never formatted on the hot path).
    pub context: &'static str,
}

impl ProxyError {
    /// A new error without a cause.
    pub fn new(kind: ErrorKind, side: Side, context: &'static str) -> Self {
        ProxyError {
            kind,
            side,
            retry: Retry::No,
            cause: None,
            context,
        }
    }

    /// A client-side error.
    pub fn downstream(kind: ErrorKind, context: &'static str) -> Self {
        Self::new(kind, Side::Downstream, context)
    }

    /// A worker-side error.
    pub fn upstream(kind: ErrorKind, context: &'static str) -> Self {
        Self::new(kind, Side::Upstream, context)
    }

    /// Marks the error as retryable.
    pub fn retryable(mut self) -> Self {
        self.retry = Retry::Allowed;
        self
    }

    /// Attaches the I/O cause.
    pub fn because(mut self, cause: io::Error) -> Self {
        self.cause = Some(cause);
        self
    }

    /// Whether the retry loop may try again.
    pub fn may_retry(&self) -> bool {
        self.retry == Retry::Allowed
    }
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} ({:?}) in {}", self.kind, self.side, self.context)?;
        if let Some(cause) = &self.cause {
            write!(f, ": {cause}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ProxyError {}

/// Adds an error kind and context to an `io::Result`, pingora's `OrErr` in miniature.
pub trait OrProxyErr<T> {
    /// Maps an I/O failure to a `ProxyError` of `kind` on `side`.
    fn or_proxy_err(
        self,
        kind: ErrorKind,
        side: Side,
        context: &'static str,
    ) -> Result<T, ProxyError>;
}

impl<T> OrProxyErr<T> for io::Result<T> {
    fn or_proxy_err(
        self,
        kind: ErrorKind,
        side: Side,
        context: &'static str,
    ) -> Result<T, ProxyError> {
        self.map_err(|e| ProxyError::new(kind, side, context).because(e))
    }
}

/// A flag value that cannot be used: every validation (`config`, the policy flags, the worker
/// flags) reports it this way, so the text always reads `invalid value for --flag: reason`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for {flag}: {reason}")]
pub struct FlagError {
    /// The flag, with its leading dashes (`--cache-threshold`).
    pub flag: &'static str,
    /// What is wrong with its value.
    pub reason: String,
}

impl FlagError {
    /// Refuses `flag`'s value for `reason`.
    pub fn new(flag: &'static str, reason: impl Into<String>) -> Self {
        FlagError {
            flag,
            reason: reason.into(),
        }
    }
}

/// The gateway's JSON error body, `{"error":{"message","type","code"}}`: every error answer the
/// gateway writes itself has this shape, whether an [`ErrorKind`]'s (`write_error_body`) or an
/// admin call's (`workers::admin::AdminError`).
pub fn error_body(status: u16, error_type: &str, message: &str) -> serde_json::Value {
    serde_json::json!({
        "error": {
            "message": message,
            "type": error_type,
            "code": status,
        }
    })
}

/// Appends the JSON error body for `kind` to `out`.
pub fn write_error_body(out: &mut Vec<u8>, kind: ErrorKind) {
    let body = error_body(kind.status(), kind.error_type(), kind.message());
    // Serializing a `Value` into a Vec cannot fail.
    let _ = serde_json::to_writer(out, &body);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_close_and_routing_errors_keep() {
        assert!(!ErrorKind::MalformedRequest.keeps_connection());
        assert!(!ErrorKind::PayloadTooLarge.keeps_connection());
        assert!(ErrorKind::InvalidJson.keeps_connection());
        assert!(ErrorKind::NoHealthyWorker.keeps_connection());
        assert!(ErrorKind::UpstreamTimeout.keeps_connection());
    }

    #[test]
    fn body_is_openai_shaped_json() {
        let mut out = Vec::new();
        write_error_body(&mut out, ErrorKind::NoHealthyWorker);
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["error"]["code"], 503);
        assert_eq!(value["error"]["type"], "service_unavailable");
        assert!(value["error"]["message"]
            .as_str()
            .unwrap()
            .contains("healthy"));
    }

    #[test]
    fn io_errors_gain_kind_and_context() {
        let r: io::Result<()> = Err(io::Error::from(io::ErrorKind::ConnectionRefused));
        let e = r
            .or_proxy_err(ErrorKind::UpstreamConnect, Side::Upstream, "connect")
            .unwrap_err();
        assert_eq!(e.kind.status(), 502);
        assert!(!e.may_retry());
        assert!(e.retryable().may_retry());
    }
}
