//! `flamegraph`: turns the text of `perf script` into folded stacks, an SVG flame graph and the
//! widest frames of kvgate's own code (`scripts/flamegraph.sh` runs it; the work is in
//! `bench_harness::flame`). The widest frames go to stdout, one `PERCENT WEIGHT NAME` line each
//! (the weight: nanoseconds of CPU for perf's `cpu-clock` event).

use std::path::PathBuf;

use bench_harness::flame::{collapse_perf_script, render_svg, widest_frames, FrameFilter};
use clap::Parser;

/// Draw a flame graph from `perf script` output and print its widest kvgate frames.
#[derive(Debug, Parser)]
#[command(name = "flamegraph", version)]
struct Cli {
    /// The text `perf script` printed for the recording.
    #[arg(long = "perf-script")]
    perf_script: PathBuf,
    /// Where to write the SVG.
    #[arg(long)]
    svg: PathBuf,
    /// Where to write the folded stacks (one `frames COUNT` line per distinct stack).
    #[arg(long)]
    folded: Option<PathBuf>,
    /// The graph's title.
    #[arg(long, default_value = "kvgate")]
    title: String,
    /// The line under the title (command, commit, date).
    #[arg(long, default_value = "")]
    subtitle: String,
    /// How many of the widest frames to print.
    #[arg(long, default_value_t = 3)]
    top: usize,
    /// Rank only frames whose name contains this.
    #[arg(long = "frames-matching", default_value = "kvgate::")]
    frames_matching: String,
    /// Skip frames whose name contains this (repeatable); by default kvgate's thread and runtime
    /// scaffolding (`kvgate::runtime::`), which every sample passes through.
    #[arg(long = "skip-frames", default_values_t = ["kvgate::runtime::".to_string()])]
    skip_frames: Vec<String>,
    /// What the weights of the recording are (perf's `cpu-clock`: nanoseconds of CPU).
    #[arg(long = "unit", default_value = "ns")]
    unit: String,
}

fn main() {
    bench_harness::cli::exit_on_error(run(Cli::parse()).map_err(bench_harness::cli::Failure::run));
}

fn run(cli: Cli) -> Result<(), String> {
    let perf_script = std::fs::read(&cli.perf_script)
        .map_err(|e| format!("cannot read {}: {e}", cli.perf_script.display()))?;
    let folded = collapse_perf_script(&perf_script)
        .map_err(|e| format!("cannot collapse {}: {e}", cli.perf_script.display()))?;
    if let Some(path) = &cli.folded {
        std::fs::write(path, &folded)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let skip: Vec<&str> = cli.skip_frames.iter().map(String::as_str).collect();
    let filter = FrameFilter {
        include: &cli.frames_matching,
        exclude: &skip,
    };
    let (frames, total) =
        widest_frames(&folded, &filter, cli.top).map_err(|e| format!("bad folded stacks: {e}"))?;
    if total == 0 {
        return Err(format!(
            "{} holds no samples: was the process busy while perf recorded it?",
            cli.perf_script.display()
        ));
    }
    let svg = render_svg(&folded, &cli.title, &cli.subtitle, &cli.unit)
        .map_err(|e| format!("cannot draw the flame graph: {e}"))?;
    std::fs::write(&cli.svg, svg)
        .map_err(|e| format!("cannot write {}: {e}", cli.svg.display()))?;
    println!(
        "# total {total} {}; widest {} frames:",
        cli.unit, cli.frames_matching
    );
    for frame in frames {
        println!(
            "{:5.1}% {:>13} {}",
            frame.share * 100.0,
            frame.weight,
            frame.name
        );
    }
    Ok(())
}
