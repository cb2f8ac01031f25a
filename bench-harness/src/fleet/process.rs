//! Processes of a fleet: [`spawn_logged`] starts one with its stdout and stderr in a log file,
//! [`log_tail`] quotes the end of that log in an error, [`Children`] holds started processes and
//! kills them when dropped (an error, a panic or Ctrl-C never leaves one running), and
//! [`sibling_binary`] finds another binary of the workspace beside the running one.

use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::watch;

use super::health::wait_until_healthy;

/// How much of a log an error quotes: the last lines that say why a process stopped.
pub const LOG_TAIL_BYTES: usize = 2000;

/// How long a killed child may take to exit before it is left to the kernel.
const EXIT_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether a log file starts afresh or keeps what earlier runs of the process wrote (a process
/// restarted on purpose, whose earlier life is part of the story).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogMode {
    Truncate,
    Append,
}

/// Starts `command` with stdin closed and its stdout and stderr in `log`; the child is killed
/// when its handle is dropped.
pub fn spawn_logged(mut command: Command, log: &Path, mode: LogMode) -> Result<Child, String> {
    let file = OpenOptions::new()
        .create(true)
        .write(true)
        .append(mode == LogMode::Append)
        .truncate(mode == LogMode::Truncate)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let stderr = file
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    command
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(stderr)
        .kill_on_drop(true);
    command
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", command.as_std().get_program()))
}

/// The last [`LOG_TAIL_BYTES`] of `log` (from a character boundary), or nothing if it cannot
/// be read.
pub fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let start = text.len().saturating_sub(LOG_TAIL_BYTES);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[start..].to_string()
}

/// Finds a binary next to the running executable (cargo puts every workspace binary in the same
/// `target/<profile>/`), or in its parent (when the executable is a test in `deps/`).
pub fn sibling_binary(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join(name), dir.parent()?.join(name)]
        .into_iter()
        .find(|p| p.is_file())
}

/// One started process: its name for messages, its handle and its log.
#[derive(Debug)]
struct Started {
    name: String,
    child: Child,
    log: PathBuf,
}

/// Started processes, each with its log; every one is killed when this is dropped.
#[derive(Debug, Default)]
pub struct Children {
    started: Vec<Started>,
}

impl Children {
    /// Starts `command` as `name` with its output in `log`; returns its process id.
    pub fn start(
        &mut self,
        name: &str,
        command: Command,
        log: &Path,
    ) -> Result<Option<u32>, String> {
        let child = spawn_logged(command, log, LogMode::Truncate)?;
        let pid = child.id();
        self.started.push(Started {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
        });
        Ok(pid)
    }

    /// Waits until `GET /health` on `addr` answers 200, failing early if a child exits (with its
    /// log's tail) or `stop` turns true; on timeout the error quotes every child's log.
    pub async fn wait_until_healthy(
        &mut self,
        addr: SocketAddr,
        timeout: Duration,
        stop: watch::Receiver<bool>,
    ) -> Result<(), String> {
        let stopped = stop.clone();
        let mut exited = false;
        let waited = wait_until_healthy(addr, "/health", timeout, stop, || {
            let running = self.check_running();
            exited = running.is_err();
            running
        })
        .await;
        // A child that exited quoted its own log; a timeout quotes them all.
        waited.map_err(|e| match exited || *stopped.borrow() {
            true => e,
            false => format!("{e}{}", self.log_tails()),
        })
    }

    /// Waits until `addr` accepts TCP connections (an engine without `GET /health`, such as
    /// `sim-engine --grpc`), failing early as [`Children::wait_until_healthy`] does.
    pub async fn wait_until_listening(
        &mut self,
        addr: SocketAddr,
        timeout: Duration,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            self.check_running()?;
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "{addr} accepted no connection within {timeout:.1?}{}",
                    self.log_tails()
                ));
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = super::health::stop_requested(&mut stop) => return Err("stopped".into()),
            }
        }
    }

    /// An error naming the first child that has exited, with its log's tail.
    pub fn check_running(&mut self) -> Result<(), String> {
        for started in &mut self.started {
            if let Ok(Some(status)) = started.child.try_wait() {
                return Err(format!(
                    "{} exited ({status}) before it was ready; its log ({}):\n{}",
                    started.name,
                    started.log.display(),
                    log_tail(&started.log)
                ));
            }
        }
        Ok(())
    }

    /// The tail of every child's log, each under its name.
    pub fn log_tails(&self) -> String {
        let logs = self.started.iter().map(|s| {
            format!(
                "\n--- {} ({}):\n{}",
                s.name,
                s.log.display(),
                log_tail(&s.log)
            )
        });
        logs.collect()
    }

    /// Kills every child, the last started first, and waits for each to exit.
    pub async fn stop(&mut self) {
        for mut started in self.started.drain(..).rev() {
            let _ = started.child.start_kill();
            let _ = tokio::time::timeout(EXIT_TIMEOUT, started.child.wait()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_tail_is_its_end_cut_on_a_character_boundary() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("child.log");
        let text = format!("{}é{}", "a".repeat(10), "b".repeat(LOG_TAIL_BYTES - 1));
        std::fs::write(&log, &text).unwrap();
        let tail = log_tail(&log);
        assert!(tail.len() <= LOG_TAIL_BYTES, "{}", tail.len());
        assert!(tail.ends_with('b') && text.ends_with(&tail));
        assert_eq!(log_tail(&dir.path().join("missing.log")), "");
    }

    #[tokio::test]
    async fn a_child_that_exits_is_reported_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sh.log");
        let mut command = Command::new("sh");
        command.args(["-c", "echo cannot bind; exit 3"]);
        let mut children = Children::default();
        children.start("sh", command, &log).unwrap();
        let (_stop, stopped) = watch::channel(false);
        let addr = SocketAddr::from(([127, 0, 0, 1], super::super::free_ports(1).unwrap()));
        let error = children
            .wait_until_healthy(addr, Duration::from_secs(10), stopped)
            .await
            .unwrap_err();
        assert!(
            error.contains("sh exited") && error.contains("cannot bind"),
            "{error}"
        );
        children.stop().await;
    }
}
