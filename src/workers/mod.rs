//! Workers as the domain sees them, free of I/O: the published worker table and its signals,
//! and the rules the control core applies to what it observes.
//!
//! - `spec`: the one worker-URL parser and [`spec::WorkerSpec`]; `role`: a worker's part in
//!   prefill/decode disaggregation ([`role::WorkerRole`]).
//! - `table`: the worker table data cores read lock-free (roster, health, in-flight and token
//!   credits); `signals`: a slot's circuit, overload, drain and load signals.
//! - `breaker`: the circuit breaker; `health`: health-check thresholds; `load`: load reports and
//!   overload protection; `retry`: retry settings and the tried-worker list.
//! - `catalog`: which workers serve which model; `admin`: the admin API's rules.
//! - `settings`: the worker flags and their validation.
//! - `discovery`: Kubernetes service discovery's flags, which pods are workers, and the
//!   reconciliation of the registered workers with them.

pub mod admin;
pub mod breaker;
pub mod catalog;
pub mod discovery;
pub mod health;
pub mod load;
pub mod retry;
pub mod role;
pub mod settings;
pub mod signals;
pub mod spec;
pub mod table;
