//! `fleet`: `bench_harness::fleet` and `bench_harness::stats` for shell scripts
//! (`scripts/lib/fleet.sh`), so a script that starts sim-engine or kvgate finds its ports, waits
//! for them, measures their CPU and reports medians and ratios the way `replay compare`,
//! `chaos` and the tests do. Each subcommand prints its answer on one line of stdout.
//!
//!   fleet ports N...                      the first port of each block of N free ports
//!   fleet wait [--timeout-s S] [--log FILE] NAME URL...
//!                                         until each URL answers GET with 200
//!   fleet cpu [--thread NAME]... PID...   CPU microseconds (user + system) used so far
//!   fleet host-cpu CPU...                 "busy total steal" clock ticks of each CPU
//!   fleet rss [--peak] PID                resident memory (or its peak) in KiB
//!   fleet stats [--decimals N] median|mean|min|max|sum X... / ratio A B / share PART WHOLE
//!   fleet drive [--system-words W] [--connections C] COUNT URL
//!                                         exactly COUNT chat POSTs to URL, each answered 200

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use bench_harness::cli::{self, exit_on_error, Failure, Threads};
use bench_harness::fleet::{self, procstat};
use bench_harness::stats;

#[derive(Parser, Debug)]
#[command(
    name = "fleet",
    about = "Ports, waits, CPU time and statistics for the benchmark scripts"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Prints the first port of each requested block of consecutive free loopback ports (below
    /// the ephemeral range; the blocks do not overlap), space-separated.
    Ports {
        #[arg(required = true)]
        counts: Vec<u16>,
    },
    /// Waits until each URL (http://HOST:PORT/PATH) answers a GET with 200; on timeout exits 1
    /// with the tail of `--log`.
    Wait {
        /// How long to wait for all of them.
        #[arg(long, default_value_t = 20)]
        timeout_s: u64,
        /// The process's log, quoted when it does not become ready.
        #[arg(long)]
        log: Option<PathBuf>,
        /// The process's name, for the error.
        name: String,
        #[arg(required = true)]
        urls: Vec<String>,
    },
    /// Prints the CPU time (user + system) the processes have used so far, in microseconds,
    /// summed; with `--thread`, only their threads of those names.
    Cpu {
        #[arg(long = "thread")]
        threads: Vec<String>,
        #[arg(required = true)]
        pids: Vec<u32>,
    },
    /// Prints "busy total steal" (clock ticks since boot, /proc/stat) of each CPU.
    HostCpu {
        #[arg(required = true)]
        cpus: Vec<usize>,
    },
    /// Prints the process's resident memory (VmRSS) in KiB; with `--peak`, the most it has had
    /// (VmHWM).
    Rss {
        #[arg(long)]
        peak: bool,
        pid: u32,
    },
    /// Prints one statistic of the numbers given ("nan" when it has none).
    Stats {
        /// Rounded to this many decimals (as C's printf rounds the double); else in full.
        #[arg(long)]
        decimals: Option<usize>,
        #[command(subcommand)]
        statistic: Statistic,
    },
    /// Sends exactly COUNT chat requests (scripts/lib/wrk.sh's bodies, cycled) as POSTs to URL
    /// (http://HOST:PORT/PATH) over kept-alive connections; exits 1 on any answer but 200.
    Drive {
        /// Words of the shared system prompt (3600: the 36 KB bodies; 0: the small ones).
        #[arg(long, default_value_t = 0)]
        system_words: usize,
        /// Connections, each sending its share of the requests one after the other.
        #[arg(long, default_value_t = 1)]
        connections: usize,
        count: usize,
        url: String,
    },
}

/// The statistics; numbers may be negative (`fleet stats sum 5 -3`).
#[derive(Subcommand, Debug)]
enum Statistic {
    /// The median.
    Median {
        #[arg(allow_negative_numbers = true)]
        values: Vec<f64>,
    },
    /// The arithmetic mean.
    Mean {
        #[arg(allow_negative_numbers = true)]
        values: Vec<f64>,
    },
    /// The smallest.
    Min {
        #[arg(allow_negative_numbers = true)]
        values: Vec<f64>,
    },
    /// The largest.
    Max {
        #[arg(allow_negative_numbers = true)]
        values: Vec<f64>,
    },
    /// The sum.
    Sum {
        #[arg(allow_negative_numbers = true)]
        values: Vec<f64>,
    },
    /// NUMERATOR / DENOMINATOR.
    #[command(allow_negative_numbers = true)]
    Ratio { numerator: f64, denominator: f64 },
    /// 100 * PART / WHOLE.
    #[command(allow_negative_numbers = true)]
    Share { part: f64, whole: f64 },
}

fn main() {
    exit_on_error(run(Cli::parse().command));
}

fn run(command: Command) -> Result<(), Failure> {
    let answer = match command {
        Command::Ports { counts } => {
            let bases = fleet::free_port_blocks(&counts).map_err(Failure::run)?;
            let bases: Vec<String> = bases.iter().map(u16::to_string).collect();
            bases.join(" ")
        }
        Command::Wait {
            timeout_s,
            log,
            name,
            urls,
        } => {
            wait(&urls, Duration::from_secs(timeout_s)).map_err(|e| {
                let tail = log.map(|log| {
                    format!(
                        "\n--- its log ({}):\n{}",
                        log.display(),
                        fleet::log_tail(&log)
                    )
                });
                Failure::run(format!("{name}: {e}{}", tail.unwrap_or_default()))
            })?;
            return Ok(());
        }
        Command::Cpu { threads, pids } => cpu_us(&threads, &pids)?.to_string(),
        Command::HostCpu { cpus } => host_cpu_times(&cpus)?,
        Command::Rss { peak, pid } => {
            let kb = match peak {
                true => procstat::peak_rss_kb(pid),
                false => procstat::rss_kb(pid),
            };
            kb.ok_or_else(|| Failure::run(format!("no process {pid} in /proc")))?
                .to_string()
        }
        Command::Stats {
            decimals,
            statistic,
        } => statistic_text(statistic, decimals),
        Command::Drive {
            system_words,
            connections,
            count,
            url,
        } => {
            let (addr, path) = split_url(&url).map_err(Failure::usage)?;
            let bodies = fleet::drive::chat_bodies(system_words);
            cli::runtime(Threads::Current)
                .block_on(fleet::drive::drive(addr, path, &bodies, count, connections))
                .map_err(Failure::run)?;
            return Ok(());
        }
    };
    println!("{answer}");
    Ok(())
}

/// "busy total steal" of each CPU, one after the other.
fn host_cpu_times(cpus: &[usize]) -> Result<String, Failure> {
    let mut times = Vec::with_capacity(cpus.len());
    for &cpu in cpus {
        let t = procstat::host_cpu(cpu)
            .ok_or_else(|| Failure::run(format!("no cpu{cpu} in /proc/stat")))?;
        times.push(format!("{} {} {}", t.busy, t.total, t.steal));
    }
    Ok(times.join(" "))
}

/// The statistic in full, or rounded to `decimals`; "nan" when it has no value.
fn statistic_text(statistic: Statistic, decimals: Option<usize>) -> String {
    let value = match statistic {
        Statistic::Median { values } => stats::median(&values),
        Statistic::Mean { values } => stats::mean(&values),
        Statistic::Min { values } => stats::min(&values),
        Statistic::Max { values } => stats::max(&values),
        Statistic::Sum { values } => Some(stats::sum(&values)),
        Statistic::Ratio {
            numerator,
            denominator,
        } => stats::ratio(numerator, denominator),
        Statistic::Share { part, whole } => stats::share(part, whole),
    };
    match (value, decimals) {
        (None, _) => "nan".to_string(),
        (Some(v), Some(decimals)) => format!("{v:.decimals$}"),
        (Some(v), None) => v.to_string(),
    }
}

/// Waits for every URL within one `timeout`.
fn wait(urls: &[String], timeout: Duration) -> Result<(), String> {
    let runtime = cli::runtime(Threads::Current);
    let deadline = tokio::time::Instant::now() + timeout;
    runtime.block_on(async {
        for url in urls {
            let (addr, path) = split_url(url)?;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            fleet::wait_until_healthy(addr, path, left, fleet::never_stopped(), || Ok(())).await?;
        }
        Ok(())
    })
}

/// `http://HOST:PORT/PATH` as the address to connect to and the path to ask for.
fn split_url(url: &str) -> Result<(SocketAddr, &str), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: not an http:// URL"))?;
    let (authority, path) = rest.find('/').map_or((rest, "/"), |i| rest.split_at(i));
    let addr = authority
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| format!("{url}: no HOST:PORT"))?;
    Ok((addr, path))
}

/// The CPU microseconds of `pids` (only their threads named in `threads`, if any).
fn cpu_us(threads: &[String], pids: &[u32]) -> Result<u64, Failure> {
    let mut total_s = 0.0;
    for &pid in pids {
        let used = if threads.is_empty() {
            procstat::cpu_s(pid)
        } else {
            threads
                .iter()
                .map(|name| procstat::thread_cpu_s(pid, name))
                .sum::<Option<f64>>()
        };
        total_s += used.ok_or_else(|| Failure::run(format!("no process {pid} in /proc")))?;
    }
    Ok((total_s * 1e6).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_print_in_full_rounded_or_as_nan() {
        let median = || Statistic::Median {
            values: vec![166.7, 200.0],
        };
        assert_eq!(statistic_text(median(), None), "183.35");
        // As printf rounds the double nearest 183.35 (just below it).
        assert_eq!(statistic_text(median(), Some(1)), "183.3");
        let by_zero = Statistic::Ratio {
            numerator: 1.0,
            denominator: 0.0,
        };
        assert_eq!(statistic_text(by_zero, Some(2)), "nan");
    }

    #[test]
    fn a_url_splits_into_its_address_and_path() {
        let (addr, path) = split_url("http://127.0.0.1:8080/health").unwrap();
        assert_eq!((addr.port(), path), (8080, "/health"));
        assert_eq!(split_url("http://127.0.0.1:9").unwrap().1, "/");
        assert!(split_url("127.0.0.1:9/health").is_err());
        assert!(split_url("http://nowhere/").is_err());
    }
}
