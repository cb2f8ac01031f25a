//! Active health checks: per-worker consecutive failure and success thresholds.
