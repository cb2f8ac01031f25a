//! Process measurements from `/proc` (Linux): the replay's own CPU time and peak memory, and the
//! resident memory of a watched process (the gateway) at 10%, 50% and 100% of a run, so the
//! million-request benchmark needs no external sampler. Elsewhere every reading is `None`.

use serde::{Deserialize, Serialize};

/// Kernel clock ticks per second in `/proc/<pid>/stat` (USER_HZ, fixed at 100 by the Linux ABI).
const USER_HZ: f64 = 100.0;

/// The fractions of a run at which the watched process is sampled.
pub const WATCH_FRACTIONS: [f64; 3] = [0.1, 0.5, 1.0];

/// The load generator's own cost over the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SelfUsage {
    /// User + system CPU seconds the replay process spent during the run.
    pub cpu_s: Option<f64>,
    /// Peak resident memory of the replay process (VmHWM) by the end of the run, in KiB.
    pub max_rss_kb: Option<u64>,
}

/// One sample of the watched process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RssSample {
    pub fraction: f64,
    pub requests: u64,
    pub rss_kb: Option<u64>,
}

/// Samples of a watched process, taken as the run crosses each of [`WATCH_FRACTIONS`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WatchedProcess {
    pub pid: u32,
    pub samples: Vec<RssSample>,
}

impl WatchedProcess {
    pub fn new(pid: u32) -> Self {
        Self {
            pid,
            samples: Vec::new(),
        }
    }

    /// Samples when `done` of `total` requests crosses the next fraction.
    pub fn on_progress(&mut self, done: u64, total: u64) {
        let Some(&fraction) = WATCH_FRACTIONS.get(self.samples.len()) else {
            return;
        };
        if total > 0 && done as f64 >= fraction * total as f64 {
            let rss_kb = rss_kb(self.pid);
            self.samples.push(RssSample {
                fraction,
                requests: done,
                rss_kb,
            });
        }
    }
}

impl WatchedProcess {
    /// Takes the end-of-run sample if the run ended before reaching 100% (stopped early, or its
    /// length was unknown).
    pub fn on_end(&mut self, done: u64, total: Option<u64>) {
        if self.samples.last().is_some_and(|s| s.fraction >= 1.0) {
            return;
        }
        let fraction = total
            .filter(|&t| t > 0)
            .map_or(1.0, |t| done as f64 / t as f64);
        self.samples.push(RssSample {
            fraction,
            requests: done,
            rss_kb: rss_kb(self.pid),
        });
    }
}

/// Resident memory of `pid` (VmRSS), in KiB.
pub fn rss_kb(pid: u32) -> Option<u64> {
    status_field(&format!("/proc/{pid}/status"), "VmRSS:")
}

/// The replay process's CPU time and peak memory so far.
pub fn self_usage() -> SelfUsage {
    SelfUsage {
        cpu_s: self_cpu_s(),
        max_rss_kb: status_field("/proc/self/status", "VmHWM:"),
    }
}

impl SelfUsage {
    /// The CPU time spent since `start` (the peak memory stays the process's peak).
    pub fn since(&self, start: &SelfUsage) -> SelfUsage {
        let cpu_s = match (self.cpu_s, start.cpu_s) {
            (Some(end), Some(start)) => Some((end - start).max(0.0)),
            _ => None,
        };
        SelfUsage {
            cpu_s,
            max_rss_kb: self.max_rss_kb,
        }
    }
}

fn status_field(path: &str, name: &str) -> Option<u64> {
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|l| l.starts_with(name))?;
    line[name.len()..].split_whitespace().next()?.parse().ok()
}

fn self_cpu_s() -> Option<f64> {
    stat_cpu_s("/proc/self/stat")
}

/// User + system CPU seconds `pid` has spent so far.
pub fn cpu_s(pid: u32) -> Option<f64> {
    stat_cpu_s(&format!("/proc/{pid}/stat"))
}

fn stat_cpu_s(path: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / USER_HZ)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_process() {
        let usage = self_usage();
        assert!(usage.max_rss_kb.is_some_and(|kb| kb > 100));
        assert!(usage.cpu_s.is_some_and(|s| s >= 0.0));
        assert!(rss_kb(std::process::id()).is_some_and(|kb| kb > 100));
        assert!(cpu_s(std::process::id()).is_some_and(|s| s >= 0.0));
    }

    #[test]
    fn samples_at_ten_fifty_and_a_hundred_percent() {
        let mut watched = WatchedProcess::new(std::process::id());
        for done in 1..=100 {
            watched.on_progress(done, 100);
        }
        let at: Vec<u64> = watched.samples.iter().map(|s| s.requests).collect();
        assert_eq!(at, vec![10, 50, 100]);
    }
}
