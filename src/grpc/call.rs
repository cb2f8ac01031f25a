//! One gRPC call on a [`Connection`]: the request (HEADERS, then the one request message as
//! DATA with END_STREAM), the response headers, the response messages one by one, and the
//! status in the trailers. Owns [`Call`], [`CallError`] and [`unary`].
//!
//! Errors: a call refused before the worker took it (`REFUSED_STREAM`, a GOAWAY that left it
//! out, a broken connection before any response) is [`CallError::Refused`]: nothing ran, so it
//! may go to another worker. A non-OK `grpc-status` is [`CallError::Status`]; a response that
//! is not gRPC, a message past `GRPC_MESSAGE_BYTES_MAX` or one that does not decode is
//! [`CallError::Malformed`]; the connection failing after the worker took the call is
//! [`CallError::Broken`]. Dropping a [`Call`] before its end resets the stream (`RST_STREAM`
//! `CANCEL`), which is how a cancelled call reaches the worker.

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use prost::Message;

use super::connection::{Connection, OpenCall};
use super::framing::{self, FramingError, MessageReader};
use super::status::{Code, GrpcStatus};

/// Why a call did not complete.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The worker did not take the call: safe to send elsewhere.
    #[error("call refused: {0}")]
    Refused(String),
    /// The call ended with a non-OK status.
    #[error("grpc-status {:?}: {}", .0.code, .0.message)]
    Status(GrpcStatus),
    /// The worker's answer is not a gRPC response kvgate can read.
    #[error("malformed gRPC response: {0}")]
    Malformed(String),
    /// The connection failed during the call.
    #[error("connection failed during the call: {0}")]
    Broken(String),
}

impl From<FramingError> for CallError {
    fn from(error: FramingError) -> CallError {
        CallError::Malformed(error.to_string())
    }
}

/// A call in progress.
#[derive(Debug)]
pub struct Call {
    /// The request side, kept to reset the stream on cancel.
    send: SendStream<Bytes>,
    /// The response body, once the headers came.
    body: Option<RecvStream>,
    response: Option<h2::client::ResponseFuture>,
    reader: MessageReader,
    /// The status, once the trailers came (or a trailers-only response).
    status: Option<GrpcStatus>,
    /// Counts the call on its connection.
    _open: OpenCall,
}

impl Call {
    /// Starts `path` (`/package.Service/Method`) on `connection` with `message` (already framed
    /// by `framing::encode`).
    pub async fn start(
        connection: &Connection,
        authority: &str,
        path: &str,
        message: Bytes,
    ) -> Result<Call, CallError> {
        let mut request = http::Request::builder()
            .method(http::Method::POST)
            .uri(format!("http://{authority}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(authorization) = connection.authorization() {
            request = request.header(http::header::AUTHORIZATION, authorization.clone());
        }
        let request = request
            .body(())
            .map_err(|e| CallError::Malformed(format!("request head: {e}")))?;
        let (response, mut send, open) = connection
            .start(request)
            .await
            .map_err(|e| CallError::Refused(e.to_string()))?;
        send.send_data(message, true)
            .map_err(|e| CallError::Refused(e.to_string()))?;
        Ok(Call {
            send,
            body: None,
            response: Some(response),
            reader: MessageReader::new(),
            status: None,
            _open: open,
        })
    }

    /// Waits for the response headers. A trailers-only response (an error before any message)
    /// ends the call here with its status.
    pub async fn headers(&mut self) -> Result<(), CallError> {
        // Awaited in place, so a wait cut short (the caller's select) loses nothing.
        let Some(pending) = self.response.as_mut() else {
            return Ok(());
        };
        let response = pending.await.map_err(refused_or_broken);
        self.response = None;
        let response = response?;
        if response.status() != http::StatusCode::OK {
            return Err(CallError::Malformed(format!(
                "HTTP status {} from the worker",
                response.status()
            )));
        }
        if let Some(status) = GrpcStatus::from_headers(response.headers()) {
            // Trailers-only: the headers are the end.
            return match status.code {
                Code::Ok => {
                    self.status = Some(status);
                    Ok(())
                }
                _ => Err(CallError::Status(status)),
            };
        }
        let grpc = response
            .headers()
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        if !grpc {
            return Err(CallError::Malformed(
                "content-type is not application/grpc".into(),
            ));
        }
        self.body = Some(response.into_body());
        Ok(())
    }

    /// The next response message; `None` once the call ended with `OK`.
    pub async fn message(&mut self) -> Result<Option<Bytes>, CallError> {
        self.headers().await?;
        loop {
            if let Some(message) = self.reader.next_message()? {
                return Ok(Some(message));
            }
            let Some(body) = self.body.as_mut() else {
                return self.ended();
            };
            match body.data().await {
                Some(Ok(data)) => {
                    // The bytes are ours now: let the worker send more.
                    let _ = body.flow_control().release_capacity(data.len());
                    self.reader.push(&data);
                }
                Some(Err(e)) => return Err(CallError::Broken(e.to_string())),
                None => {
                    self.reader.finish()?;
                    let trailers = body
                        .trailers()
                        .await
                        .map_err(|e| CallError::Broken(e.to_string()))?;
                    let status = trailers
                        .as_ref()
                        .and_then(GrpcStatus::from_headers)
                        .unwrap_or_else(|| {
                            GrpcStatus::missing("the call ended without a grpc-status")
                        });
                    self.status = Some(status);
                    self.body = None;
                    return self.ended();
                }
            }
        }
    }

    /// The end of a call whose status arrived.
    fn ended(&self) -> Result<Option<Bytes>, CallError> {
        match &self.status {
            Some(status) if status.code == Code::Ok => Ok(None),
            Some(status) => Err(CallError::Status(status.clone())),
            None => Err(CallError::Malformed("no status".into())),
        }
    }

    /// Whether the call has ended (its status arrived).
    pub fn is_done(&self) -> bool {
        self.status.is_some()
    }

    /// Resets the stream (`RST_STREAM` `CANCEL`): the worker stops the call.
    pub fn cancel(&mut self) {
        if self.status.is_none() {
            self.send.send_reset(h2::Reason::CANCEL);
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// An error while waiting for the response headers: refused (the worker never took the call)
/// or broken.
fn refused_or_broken(error: h2::Error) -> CallError {
    let refused = error.is_go_away()
        || error.reason() == Some(h2::Reason::REFUSED_STREAM)
        || (error.is_io() && !error.is_remote());
    match refused {
        true => CallError::Refused(error.to_string()),
        false => CallError::Broken(error.to_string()),
    }
}

/// A unary call: one request, one response message, then `OK`.
pub async fn unary<Resp: Message + Default>(
    connection: &Connection,
    authority: &str,
    path: &str,
    request: &impl Message,
) -> Result<Resp, CallError> {
    let mut call = Call::start(connection, authority, path, framing::encode(request)).await?;
    let message = call
        .message()
        .await?
        .ok_or_else(|| CallError::Malformed("a unary call ended without its answer".into()))?;
    let response = Resp::decode(message).map_err(|e| CallError::Malformed(e.to_string()))?;
    // The status follows the answer.
    if call.message().await?.is_some() {
        return Err(CallError::Malformed("a unary call answered twice".into()));
    }
    Ok(response)
}
