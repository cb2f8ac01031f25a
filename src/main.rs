//! The `kvgate` binary: parse flags, validate them into a config, run the gateway.
//! A flag clap refuses gets clap's whole message (its hints), a value kvgate refuses one
//! `Error: ...` line; either exits 2.

use std::io::IsTerminal;

use kvgate::config::{Cli, Config, LogFormat};
use kvgate::net::memory::HeapPages;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // Before the index and the mesh's maps are allocated (why: `net::memory`).
    let heap_pages = kvgate::net::memory::keep_heap_on_small_pages();
    // clap's whole message on a bad flag: its hints ("a similar argument exists", the accepted
    // values, the usage line) are what the operator needs to fix the command line.
    let cli = Cli::parse_plain();
    let config = Config::from_cli(&cli).unwrap_or_else(|e| fail(&e.to_string()));
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(config.log_level.as_filter()));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour_wanted());
    match config.log_format {
        LogFormat::Text => logs.init(),
        // SMG's layout: the event's fields at the top level beside `message`, and where it
        // was logged from.
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_file(true)
            .with_line_number(true)
            .init(),
    }
    match heap_pages {
        HeapPages::Small => tracing::debug!(
            "transparent huge pages off for the heap (MIMALLOC_ALLOW_THP=1 keeps mimalloc's)"
        ),
        HeapPages::AsConfigured => tracing::info!("heap pages as MIMALLOC_ALLOW_THP sets them"),
        HeapPages::Refused(e) => tracing::warn!(
            error = %e,
            "could not turn transparent huge pages off for the heap; the control core pays \
             2 MiB of zeroing per fresh region it touches"
        ),
    }
    if let Err(e) = kvgate::runtime::run(config) {
        fail(&e.to_string());
    }
}

/// Colour codes only for a person at a terminal: a file or a pipe (journald, a log shipper)
/// gets plain text, and `NO_COLOR` (no-color.org) turns them off everywhere.
fn colour_wanted() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn fail(message: &str) -> ! {
    eprintln!("Error: {message}");
    std::process::exit(2);
}
