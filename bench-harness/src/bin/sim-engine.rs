//! `sim-engine`: a simulated fleet of LLM engines on consecutive loopback ports
//! (`bench_harness::sim`), optionally publishing their KV events over ZMQ. Prints
//! `sim-engine: ready` on stdout once every port is bound; logs go to stderr (`RUST_LOG`,
//! default `warn`).

use bench_harness::sim::{server, SimArgs};
use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() {
    let options = match SimArgs::parse().validate() {
        Ok(options) => options,
        Err(message) => exit_with(&message),
    };
    // The KV-event sockets log their errors (a failed send, a malformed replay request).
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let runtime = if options.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.threads)
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => exit_with(&format!("cannot start the tokio runtime: {error}")),
    };
    if let Err(message) = runtime.block_on(server::run_fleet(options)) {
        exit_with(&message);
    }
}

fn exit_with(message: &str) -> ! {
    eprintln!("Error: {message}");
    std::process::exit(1);
}
