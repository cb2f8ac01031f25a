//! Core pinning, the per-core monoio runtimes, SO_REUSEPORT listeners and shutdown.
