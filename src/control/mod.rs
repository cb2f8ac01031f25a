//! The control core: the single writer of shared state. It drains the data cores' dispatch
//! records into the index, runs eviction, polls load, checks health and serves admin mutations.
