//! The per-worker circuit breaker (closed, open, half-open) over a sliding failure window.
