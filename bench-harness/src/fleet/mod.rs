//! The plumbing every tool that starts a fleet shares: `replay compare`, `chaos`, the integration
//! tests' fixtures (`tests/utils`) and, through the `fleet` binary, the scripts
//! (`scripts/lib/fleet.sh`). One place each for:
//!
//! - [`ports`]: blocks of free loopback ports below Linux's ephemeral range;
//! - [`process`]: a child started with its output in a log file ([`spawn_logged`]), the tail of
//!   that log for an error message, a set of children killed when dropped ([`Children`]), and
//!   the workspace's other binaries found beside the running one ([`sibling_binary`]);
//! - [`health`]: waiting until a port accepts connections, or until an HTTP GET answers 200,
//!   always within a deadline;
//! - [`http`]: the one small HTTP client (hyper) the plumbing and the chaos driver's probes use;
//! - [`procstat`]: CPU time and memory of processes and threads, read from `/proc`.
//!
//! Errors are `String`s that name the process, port or file, for the tool to print.

pub mod drive;
pub mod health;
pub mod http;
pub mod ports;
pub mod process;
pub mod procstat;

pub use health::{
    never_stopped, stop_requested, wait_for_port, wait_until_healthy, STARTUP_TIMEOUT,
};
pub use ports::{free_port_blocks, free_ports};
pub use process::{log_tail, sibling_binary, spawn_logged, Children, LogMode};
