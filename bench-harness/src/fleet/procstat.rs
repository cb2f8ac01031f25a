//! Process measurements from `/proc` (Linux): CPU time of a process ([`cpu_s`]) or of its
//! threads of one name ([`thread_cpu_s`]), how busy each of the host's CPUs was
//! ([`host_cpu`]), resident memory now and at its peak ([`rss_kb`], [`peak_rss_kb`]), and for `replay` its own CPU time and peak
//! memory ([`self_usage`]) and a watched process's memory at 10%, 50% and 100% of a run
//! ([`WatchedProcess`]), so no benchmark needs an external sampler. Elsewhere every reading is
//! `None`.

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

/// The most resident memory `pid` has had (VmHWM), in KiB.
pub fn peak_rss_kb(pid: u32) -> Option<u64> {
    status_field(&format!("/proc/{pid}/status"), "VmHWM:")
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

/// User + system CPU seconds spent so far by the threads of `pid` whose name (`comm`) is `name`
/// (kvgate names its threads: `kvgate-control`, `kvgate-mesh`, ...); 0 when none has it.
pub fn thread_cpu_s(pid: u32, name: &str) -> Option<f64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0.0;
    for task in tasks.flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            // A thread that ended between the listing and the read spent nothing more.
            total += stat_cpu_s(&path.join("stat").to_string_lossy()).unwrap_or(0.0);
        }
    }
    Some(total)
}

/// One CPU's time since boot from `/proc/stat`, in clock ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostCpu {
    /// user, nice, system, irq and softirq: running anything.
    pub busy: u64,
    /// busy, idle, iowait and steal.
    pub total: u64,
    /// Taken by the hypervisor for other guests.
    pub steal: u64,
}

/// The times of CPU `cpu` (the `cpuN` line of `/proc/stat`).
pub fn host_cpu(cpu: usize) -> Option<HostCpu> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let label = format!("cpu{cpu}");
    let line = stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some(label.as_str()))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let field = |i: usize| ticks.get(i).copied().unwrap_or(0);
    let busy = field(0) + field(1) + field(2) + field(5) + field(6);
    Some(HostCpu {
        busy,
        total: busy + field(3) + field(4) + field(7),
        steal: field(7),
    })
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
        let (rss, peak) = (rss_kb(std::process::id()), peak_rss_kb(std::process::id()));
        assert!(rss.is_some() && peak >= rss, "{rss:?} {peak:?}");
        assert!(cpu_s(std::process::id()).is_some_and(|s| s >= 0.0));
    }

    #[test]
    fn counts_only_the_threads_of_the_name() {
        let pid = std::process::id();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let spinner = std::thread::Builder::new()
            .name("procstat-spin".into())
            .spawn(move || {
                let until = std::time::Instant::now() + std::time::Duration::from_millis(300);
                let mut x = 0u64;
                while std::time::Instant::now() < until {
                    x = x.wrapping_add(std::hint::black_box(1));
                }
                let _ = rx.recv();
                x
            })
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(400));
        let spun = thread_cpu_s(pid, "procstat-spin").unwrap();
        assert!(spun > 0.0, "{spun}");
        assert_eq!(thread_cpu_s(pid, "no-such-thread"), Some(0.0));
        assert!(spun <= cpu_s(pid).unwrap());
        drop(tx);
        spinner.join().unwrap();
    }

    #[test]
    fn a_host_cpu_is_busy_no_more_than_its_total() {
        let cpu = host_cpu(0).unwrap();
        assert!(
            cpu.busy <= cpu.total && cpu.steal <= cpu.total && cpu.total > 0,
            "{cpu:?}"
        );
        assert_eq!(host_cpu(1 << 20), None);
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
