//! The worker table: fixed-capacity slots indexed by `WorkerId`, read lock-free by data cores.
