//! [`SimBody`], the response body type of the simulated engines: a whole buffer, a fixed list of
//! chunks (instant mode, injected truncation), or a live token stream rendered as SSE while the
//! engine emits tokens. A body that ends with an `Err` frame makes hyper drop the connection,
//! which is how the `drop_mid_stream` fault reaches the client.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;
use tokio::time::Sleep;

use super::api::{stream_chunk, Endpoint, ResponseContext};
use super::driver::RequestGuard;
use super::engine::Emit;

/// A response body.
#[derive(Debug)]
pub enum SimBody {
    /// One buffer (taken on first poll).
    Full(Option<Bytes>),
    /// Pre-rendered chunks; after `fail_after` of them the connection is dropped.
    Chunks {
        chunks: VecDeque<Bytes>,
        fail_after: Option<usize>,
        drop: DropAfterFlush,
    },
    /// SSE chunks rendered as the engine emits tokens.
    Tokens(Box<TokenStream>),
}

impl SimBody {
    /// A body holding `bytes`.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        SimBody::Full(Some(bytes.into()))
    }

    /// Pre-rendered chunks, dropping the connection after `fail_after` of them.
    pub fn chunks(chunks: VecDeque<Bytes>, fail_after: Option<usize>) -> Self {
        SimBody::Chunks {
            chunks,
            fail_after,
            drop: DropAfterFlush::default(),
        }
    }

    /// An empty body.
    pub fn empty() -> Self {
        SimBody::Full(None)
    }
}

/// The live SSE stream of one request.
#[derive(Debug)]
pub struct TokenStream {
    pub receiver: mpsc::UnboundedReceiver<Emit>,
    /// Cancels the request in the engine when the client goes away.
    pub guard: RequestGuard,
    pub endpoint: Endpoint,
    /// Shared fields of every chunk; token counts are filled from each [`Emit`].
    pub context: ResponseContext,
    /// Simulated arrival time, for `e2e_latency`.
    pub arrival_us: u64,
    /// Drop the connection after this many chunks (`drop_mid_stream` fault).
    pub fail_after: Option<usize>,
    /// The cached tokens to report instead of the engine's own (a decode engine reports its
    /// prefill engine's: the prompt came from that cache).
    pub reported_cached: Option<u32>,
    pub chunks_sent: usize,
    pub done: bool,
    pub drop: DropAfterFlush,
}

/// Real time between the last chunk and an injected drop, so hyper flushes what was sent: a
/// client sees a truncated response, not an empty one.
const DROP_FLUSH_DELAY: Duration = Duration::from_millis(20);

/// Fails the body once [`DROP_FLUSH_DELAY`] has passed since its first poll.
#[derive(Debug, Default)]
pub struct DropAfterFlush {
    delay: Option<Pin<Box<Sleep>>>,
}

impl DropAfterFlush {
    fn poll_drop(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let delay = self
            .delay
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(DROP_FLUSH_DELAY)));
        delay.as_mut().poll(cx).map(|()| {
            io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "sim-engine: injected mid-stream drop",
            )
        })
    }
}

impl TokenStream {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.drop_due() {
            let error = std::task::ready!(self.drop.poll_drop(cx));
            self.done = true;
            return Poll::Ready(Some(Err(error)));
        }
        let Some(first) = std::task::ready!(self.receiver.poll_recv(cx)) else {
            self.done = true;
            let error = io::Error::other("sim-engine: request cancelled");
            return Poll::Ready(Some(Err(error)));
        };
        let mut chunk = String::new();
        self.render(first, &mut chunk);
        // Tokens already due (several steps delivered in one timer tick at high speed-ups)
        // leave in one write instead of one syscall each.
        while !self.done && !self.drop_due() {
            match self.receiver.try_recv() {
                Ok(emit) => self.render(emit, &mut chunk),
                Err(_) => break,
            }
        }
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(chunk)))))
    }

    fn drop_due(&self) -> bool {
        self.fail_after
            .is_some_and(|limit| self.chunks_sent >= limit)
    }

    fn render(&mut self, emit: Emit, out: &mut String) {
        self.context.completion_tokens = emit.completion_tokens;
        self.context.cached_tokens = self.reported_cached.unwrap_or(emit.cached_tokens);
        self.context.prompt_tokens = emit.prompt_tokens;
        self.context.e2e_latency_s = emit.at_us.saturating_sub(self.arrival_us) as f64 / 1e6;
        self.done = emit.finished;
        self.chunks_sent += 1;
        out.push_str(&stream_chunk(self.endpoint, &self.context, emit.finished));
    }
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.get_mut() {
            SimBody::Full(bytes) => Poll::Ready(bytes.take().map(|bytes| Ok(Frame::data(bytes)))),
            SimBody::Chunks {
                chunks,
                fail_after,
                drop,
            } => {
                if *fail_after == Some(0) {
                    let error = std::task::ready!(drop.poll_drop(cx));
                    *fail_after = None;
                    chunks.clear();
                    return Poll::Ready(Some(Err(error)));
                }
                if let Some(remaining) = fail_after.as_mut() {
                    *remaining -= 1;
                }
                Poll::Ready(chunks.pop_front().map(|chunk| Ok(Frame::data(chunk))))
            }
            SimBody::Tokens(stream) => stream.poll_next(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            SimBody::Full(bytes) => bytes.is_none(),
            SimBody::Chunks {
                chunks, fail_after, ..
            } => chunks.is_empty() && fail_after.is_none(),
            SimBody::Tokens(stream) => stream.done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SimBody::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            SimBody::Full(None) => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}
