//! The `kvgate` binary: parse flags, validate them into a config, run the gateway.
//! Any failure is one `Error: ...` line on stderr and a non-zero exit.

use clap::Parser;
use kvgate::config::{Cli, Config, LogFormat};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => fail(
            e.to_string()
                .lines()
                .next()
                .unwrap_or("bad arguments")
                .trim_start_matches("error: "),
        ),
    };
    let config = Config::from_cli(&cli).unwrap_or_else(|e| fail(&e.to_string()));
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(config.log_level.as_filter()));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    if let Err(e) = kvgate::runtime::run(config) {
        fail(&e.to_string());
    }
}

fn fail(message: &str) -> ! {
    eprintln!("Error: {message}");
    std::process::exit(2);
}
