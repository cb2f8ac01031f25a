//! Routing policies: the `cache_aware` decision flow, the expected-wait scorer, and the simpler
//! policies (`random`, `round_robin`, `power_of_two`, `least_load`, `prefix_hash`,
//! `consistent_hashing`).
