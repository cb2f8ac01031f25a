//! `replay`: the load generator that replays LLM request traces, or generated shared-prefix
//! workloads, through a gateway and reports what the engines cached and how long requests took.
//!
//! The pipeline, one module per stage: a [`workload`] source ([`trace`] files — Mooncake, Azure,
//! [`captured`] request logs, [`token_ids`] traces —, [`sharegpt`] conversations, or the
//! [`synthetic`] generator; lines it cannot use counted by [`skip`]; files read by
//! [`records`], generated prompts kept as seeded [`content`] segments, real ones as
//! [`conversation`] text) → [`pacing`] (when each request is due) → [`form`] (the request body)
//! → [`client`] (pooled keep-alive HTTP, [`sse`] streaming) → [`report`] (histograms and the one
//! serializable result) → printers (text table, JSON, [`plot`]). [`run`] wires one replay;
//! [`compare`] runs one per policy against fresh `sim-engine` fleets and `kvgate`s. Bounds live
//! in [`limits`]; the command line in [`cli`].
//! Errors are `String`s naming the flag or file to fix; [`run_cli`] tells a wrong command line
//! from a failed run ([`crate::cli::Failure`]) and the binary prints them as `Error: ...`.

pub mod captured;
pub mod cli;
pub mod client;
pub mod compare;
pub mod content;
pub mod conversation;
pub mod flat_json;
pub mod form;
pub mod limits;
pub mod pacing;
pub mod plot;
pub mod progress;
pub mod records;
pub mod report;
pub mod run;
pub mod samples;
pub mod sharegpt;
pub mod skip;
pub mod sse;
pub mod synthetic;
pub mod token_ids;
pub mod trace;
pub mod workload;

use std::path::Path;

use tokio::sync::watch;

use crate::cli::Failure;
use cli::{Cli, Command};
use report::{table, ReplayReport};

/// Runs what the command line asks for, printing the table to stdout and writing the files. A
/// command line that does not make a run is a [`Failure::usage`], anything after a
/// [`Failure::run`].
pub async fn run_cli(cli: Cli, stop: watch::Receiver<bool>) -> Result<(), Failure> {
    match cli.command {
        Some(Command::Compare(args)) => {
            let options = args.compare_options().map_err(Failure::usage)?;
            compare::validate(&options).map_err(Failure::usage)?;
            let reports = compare::run_compare(&options, stop)
                .await
                .map_err(Failure::run)?;
            print!("{}", table(&reports));
            for report in &reports {
                let flags = compare::gateway_flags(&options, &report.label);
                println!("{}: {flags}", report.label);
            }
            write_json(&args.out, &serde_json::json!({ "policies": reports }))
                .map_err(Failure::run)?;
            plot::write_plot(&args.plot, &reports).map_err(Failure::run)?;
            eprintln!("wrote {} and {}", args.out.display(), args.plot.display());
            Ok(())
        }
        None => {
            let gateway = cli.replay.gateway.clone().ok_or_else(|| {
                Failure::usage("--gateway URL is required (or use `replay compare`)")
            })?;
            let options = cli
                .replay
                .workload
                .replay_options(gateway)
                .map_err(Failure::usage)?;
            let report = run::run_replay(&options, stop)
                .await
                .map_err(Failure::run)?;
            print!("{}", table(std::slice::from_ref(&report)));
            if let Some(out) = &cli.replay.out {
                write_json(out, &report).map_err(Failure::run)?;
            }
            let plot_path = cli
                .replay
                .plot
                .clone()
                .or_else(|| cli.replay.out.as_ref().map(|o| o.with_extension("svg")));
            if let Some(path) = plot_path {
                plot::write_plot(&path, std::slice::from_ref(&report)).map_err(Failure::run)?;
            }
            warn_about(&report);
            Ok(())
        }
    }
}

fn warn_about(report: &ReplayReport) {
    if report.skipped_lines > 0 {
        let kinds: Vec<String> = report
            .skipped_by_kind
            .iter()
            .map(|(kind, count)| format!("{kind} {count}"))
            .collect();
        eprintln!(
            "warning: {} {} trace lines were skipped ({}); the report's warnings name the first ones",
            report.skipped_lines,
            report.trace_format.as_deref().unwrap_or("trace"),
            kinds.join(", ")
        );
    }
    if report.unattributed_requests > 0 {
        eprintln!(
            "warning: {} responses had no x-smg-routed-worker-id header",
            report.unattributed_requests
        );
    }
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), String> {
    let text =
        serde_json::to_string_pretty(value).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::write(path, text + "\n").map_err(|e| format!("--out {}: {e}", path.display()))
}
