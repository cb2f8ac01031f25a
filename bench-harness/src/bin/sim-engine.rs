//! `sim-engine`: a simulated fleet of LLM engines on consecutive loopback ports
//! (`bench_harness::sim`), optionally publishing their KV events over ZMQ. Prints
//! `sim-engine: ready` on stdout once every port is bound; logs go to stderr (`RUST_LOG`,
//! default `warn`).

use bench_harness::cli::{self, exit_on_error, exit_with, Failure, Threads};
use bench_harness::sim::{server, SimArgs};
use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() {
    let options = match SimArgs::parse().validate() {
        Ok(options) => options,
        Err(message) => exit_with(&Failure::usage(message)),
    };
    // The KV-event sockets log their errors (a failed send, a malformed replay request).
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = cli::runtime(match options.threads {
        0 | 1 => Threads::Current,
        threads => Threads::Pool(Some(threads)),
    });
    exit_on_error(
        runtime
            .block_on(server::run_fleet(options))
            .map_err(Failure::run),
    );
}
