//! `chaos`: the seeded chaos test of kvgate (see `bench_harness::chaos` and `scripts/chaos.sh`).
//! Exits 1 when an invariant fails, printing the seed and the command that reproduces the run.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use bench_harness::chaos::plan::PlanConfig;
use bench_harness::chaos::run::{run_chaos, ChaosOptions};
use bench_harness::cli::{self, exit_with, Failure, Threads, EXIT_FAILED, EXIT_USAGE};
use bench_harness::fleet::sibling_binary;

/// Replays a seeded workload through kvgate while engines are killed, restarted, hung, slowed
/// and made to fail, clients abort, and workers are removed and added; then checks invariants.
#[derive(Parser, Debug)]
#[command(name = "chaos")]
struct Args {
    /// Everything random in the run (requests, aborts, faults) derives from this seed.
    #[arg(long)]
    seed: u64,
    /// Load time in minutes (the heal and the drain come after it).
    #[arg(long, default_value_t = 1.0)]
    minutes: f64,
    /// Warm-up in seconds: load without faults; the gateway's RSS after it is the baseline.
    /// Default: a sixth of the run, between 10 and 60 s.
    #[arg(long)]
    warmup_s: Option<f64>,
    /// Simulated engines, one process each.
    #[arg(long, default_value_t = 4)]
    engines: usize,
    /// Mean requests per second.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Mean seconds between two faults.
    #[arg(long, default_value_t = 3.0)]
    fault_every_s: f64,
    /// Requests decoding for about a minute whose clients leave early, sent in the last 2 s of
    /// the load: the drain check then shows whether the gateway ends a request when its client
    /// leaves.
    #[arg(long, default_value_t = 8)]
    abort_probes: u32,
    /// A request not answered within this many seconds is a hang (a violation). The longest
    /// requests decode for about 7 s alone at --speedup 2, several times that in a busy batch,
    /// and may wait out a 12 s hang and start over on another engine after a kill.
    #[arg(long, default_value_t = 120)]
    client_timeout_s: u64,
    /// Seconds the gateway and the engines may take to reach zero requests in flight once every
    /// client has its answer or has left: only requests of clients that left can remain, and the
    /// gateway must end those at once (a long one would otherwise decode for seconds more).
    #[arg(long, default_value_t = 5)]
    drain_timeout_s: u64,
    /// sim-engine's --speedup (its prefill and decode times divided by this). At 2 a long
    /// request decodes for several seconds, longer than the drain allows.
    #[arg(long, default_value_t = 2.0)]
    sim_speedup: f64,
    /// Folder with kvgate and sim-engine (default: next to this binary).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Where logs, the plan, the event log and report.json go.
    #[arg(long, default_value = "target/chaos")]
    out_dir: PathBuf,
    /// The command that reproduces this run, printed when it fails (scripts/chaos.sh passes its own).
    #[arg(long)]
    repro: Option<String>,
    /// Print the seed's fault plan (times, engines, actions) and exit without running it.
    #[arg(long)]
    plan_only: bool,
    /// Extra kvgate flags (after `--`).
    #[arg(last = true)]
    kvgate_args: Vec<String>,
}

fn main() {
    let args = Args::parse();
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(args.minutes) || args.engines < 2 || !positive(args.rate) {
        exit_with(&Failure::usage(
            "--minutes and --rate must be positive, --engines at least 2",
        ));
    }
    let duration = Duration::from_secs_f64(args.minutes * 60.0);
    let warmup = Duration::from_secs_f64(
        args.warmup_s
            .unwrap_or_else(|| (duration.as_secs_f64() / 6.0).clamp(10.0, 60.0))
            .min(duration.as_secs_f64() / 2.0),
    );
    let Some(bin_dir) = args
        .bin_dir
        .clone()
        .or_else(|| sibling_binary("kvgate").and_then(|p| p.parent().map(PathBuf::from)))
    else {
        exit_with(&Failure::usage(
            "kvgate is not next to this binary; build it or pass --bin-dir",
        ));
    };
    let repro = args.repro.clone().unwrap_or_else(|| {
        let mut words: Vec<String> = std::env::args().collect();
        words.iter_mut().for_each(|w| {
            if w.contains(' ') {
                *w = format!("'{w}'");
            }
        });
        words.join(" ")
    });
    let options = ChaosOptions {
        plan: PlanConfig {
            seed: args.seed,
            duration,
            warmup,
            engines: args.engines,
            rate: args.rate,
            fault_every_s: args.fault_every_s,
            abort_probes: args.abort_probes,
        },
        bin_dir,
        out_dir: args.out_dir.clone(),
        client_timeout: Duration::from_secs(args.client_timeout_s),
        drain_timeout: Duration::from_secs(args.drain_timeout_s),
        sim_speedup: args.sim_speedup,
        kvgate_args: args.kvgate_args.clone(),
        repro: repro.clone(),
    };
    if args.plan_only {
        let plan = bench_harness::chaos::plan::generate(&options.plan);
        println!("{} requests", plan.requests.len());
        for event in &plan.faults {
            println!(
                "{:>8.2}s engine {} {}",
                event.at.as_secs_f64(),
                event.engine,
                event.action.label()
            );
        }
        return;
    }
    let runtime = cli::runtime(Threads::Pool(None));
    // On Ctrl-C the run is dropped, and with it the child processes (killed on drop).
    let result = runtime.block_on(async {
        tokio::select! {
            result = run_chaos(options) => result,
            _ = tokio::signal::ctrl_c() => Err("interrupted".to_string()),
        }
    });
    drop(runtime);
    let report = match result {
        Ok(report) => report,
        Err(message) => {
            eprintln!("chaos: seed {} could not run: {message}", args.seed);
            eprintln!("reproduce: {repro}");
            std::process::exit(EXIT_USAGE);
        }
    };
    let path = args.out_dir.join("report.json");
    if let Ok(text) = serde_json::to_string_pretty(&report) {
        let _ = std::fs::write(&path, text + "\n");
    }
    println!(
        "chaos seed {}: {} requests over {:.0} s",
        report.seed, report.requests, report.duration_s
    );
    println!("  outcomes: {:?}", report.outcomes);
    println!("  faults injected: {:?}", report.faults_injected);
    println!("  admin calls: {:?}", report.admin_calls);
    println!(
        "  drain: {}, gateway-counted cut responses {}",
        report.drain_s.map_or("not reached".into(), |s| format!(
            "{s:.2} s to zero in flight"
        )),
        report.gateway_cut_responses
    );
    println!(
        "  gateway RSS KiB: after warm-up {:?}, peak {:?}, after drain {:?}",
        report.rss_warmup_kib, report.rss_peak_kib, report.rss_final_kib
    );
    println!(
        "  report, plan, events and logs in {}",
        args.out_dir.display()
    );
    if report.violations.is_empty() {
        println!("chaos seed {}: every invariant held", report.seed);
        return;
    }
    eprintln!(
        "chaos seed {} FAILED: {} violation(s)",
        report.seed,
        report.violations.len()
    );
    for violation in report.violations.iter().take(20) {
        eprintln!("  - {violation}");
    }
    if report.violations.len() > 20 {
        eprintln!(
            "  ... and {} more in {}",
            report.violations.len() - 20,
            path.display()
        );
    }
    eprintln!("reproduce: {repro}");
    std::process::exit(EXIT_FAILED);
}
