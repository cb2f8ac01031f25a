//! Processes under test: free ports, `ChildProcess` (killed and reaped on drop), `SimFleet`
//! (with its `/sim` control API) and `Gateway` (with its admin and metrics endpoints). Binaries
//! are taken from the target directory of the tests, whichever crate they belong to
//! (`scripts/test.sh` builds all binaries first). Ports, waits and binaries are
//! `bench_harness::fleet`'s, as for `replay compare`, `chaos` and the scripts.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bench_harness::fleet;

use super::client::{HttpClient, Response, JSON};
use super::TIMEOUT;

/// A port that was free a moment ago on 127.0.0.1, below Linux's ephemeral range.
pub fn free_port() -> u16 {
    free_port_block(1)
}

/// The first of `n` consecutive ports that were all free a moment ago, below Linux's ephemeral
/// range (32768 up): there the test's own outgoing connections cannot take one before the
/// process it is for binds it.
pub fn free_port_block(n: u16) -> u16 {
    fleet::free_ports(n).unwrap_or_else(|e| panic!("{e}"))
}

/// A binary of this workspace: every one lies in the target directory the test runs from.
pub fn workspace_bin(name: &str) -> PathBuf {
    fleet::sibling_binary(name).unwrap_or_else(|| {
        panic!("{name} is missing beside the test: run `cargo build --workspace --bins` first")
    })
}

/// Waits until something accepts TCP connections on `port`.
pub fn wait_for_port(port: u16, timeout: Duration) -> bool {
    fleet::wait_for_port(SocketAddr::from(([127, 0, 0, 1], port)), timeout)
}

/// A child process that is killed and reaped when dropped.
#[derive(Debug)]
pub struct ChildProcess {
    child: Option<Child>,
    name: String,
}

impl ChildProcess {
    /// Spawns `command` (stdin closed; stderr shown only with `KVGATE_TEST_LOGS=1`).
    pub fn spawn(name: &str, command: &mut Command) -> Self {
        let stderr = if std::env::var_os("KVGATE_TEST_LOGS").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        };
        Self::spawn_with_stderr(name, command, stderr)
    }

    /// Spawns `command` with its stderr going to `stderr` (stdin closed).
    pub fn spawn_with_stderr(name: &str, command: &mut Command, stderr: Stdio) -> Self {
        let child = command
            .stdin(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        ChildProcess {
            child: Some(child),
            name: name.to_string(),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`).
    pub fn signal(&self, signal: i32) {
        // SAFETY: `kill` with a pid we own and a valid signal number has no memory effects.
        unsafe {
            libc::kill(self.pid() as i32, signal);
        }
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Kills the process now and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Takes its stdout (if piped).
    pub fn stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.as_mut()?.stdout.take()
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
        let _ = &self.name;
    }
}

/// A running `sim-engine` fleet: engine `i` on `base_port + i`.
#[derive(Debug)]
pub struct SimFleet {
    /// The process.
    pub process: ChildProcess,
    /// Port of engine 0.
    pub base_port: u16,
    /// Number of engines.
    pub engines: u16,
}

impl SimFleet {
    /// Starts `engines` engines with extra flags `args`; returns once it printed it is ready.
    pub fn start(engines: u16, args: &[&str]) -> Self {
        // A block found free can be taken before sim-engine binds it (by another test's
        // process, or as the ephemeral port of an outgoing connection). sim-engine then exits
        // at once, so another block is tried.
        const ATTEMPTS: usize = 5;
        for _ in 0..ATTEMPTS {
            if let Some(fleet) = Self::try_start(engines, args) {
                return fleet;
            }
        }
        panic!(
            "sim-engine {args:?} exited before it was ready {ATTEMPTS} times \
             (KVGATE_TEST_LOGS=1 shows its errors)"
        );
    }

    /// One start on a fresh block of ports: `None` if sim-engine exited before it was ready.
    pub fn try_start(engines: u16, args: &[&str]) -> Option<Self> {
        let base_port = free_port_block(engines);
        let mut command = Command::new(workspace_bin("sim-engine"));
        command
            .args([
                "--engines",
                &engines.to_string(),
                "--base-port",
                &base_port.to_string(),
            ])
            .args(args)
            .stdout(Stdio::piped());
        let mut process = ChildProcess::spawn("sim-engine", &mut command);
        let stdout = process.stdout().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("sim-engine: ready") {
                    let _ = tx.send(());
                }
            }
        });
        match rx.recv_timeout(TIMEOUT) {
            Ok(()) => Some(SimFleet {
                process,
                base_port,
                engines,
            }),
            // Its stdout closed: it exited (its ports were taken, or its flags refused).
            Err(mpsc::RecvTimeoutError::Disconnected) => None,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("sim-engine did not become ready within {TIMEOUT:?}")
            }
        }
    }

    /// The port of engine `i`.
    pub fn port(&self, i: u16) -> u16 {
        self.base_port + i
    }

    /// The URL of engine `i`, as given to `--worker-urls`.
    pub fn url(&self, i: u16) -> String {
        format!("http://127.0.0.1:{}", self.port(i))
    }

    /// The URLs of all engines.
    pub fn urls(&self) -> Vec<String> {
        (0..self.engines).map(|i| self.url(i)).collect()
    }

    /// A new client connection straight to engine `i` (not through a gateway).
    pub fn client(&self, i: u16) -> HttpClient {
        HttpClient::connect(([127, 0, 0, 1], self.port(i)).into())
    }

    /// `GET /sim/stats` of engine `i`.
    pub fn stats(&self, i: u16) -> serde_json::Value {
        self.client(i).get("/sim/stats").json()
    }

    /// Changes engine `i`'s injected faults (`POST /sim/faults` with the fields to change).
    pub fn set_faults(&self, i: u16, patch: serde_json::Value) {
        let response = self.client(i).post_json("/sim/faults", &patch.to_string());
        assert_eq!(
            response.status,
            200,
            "sim faults {patch}: {}",
            response.text()
        );
    }
}

/// A running `kvgate` on loopback.
#[derive(Debug)]
pub struct Gateway {
    /// The process.
    pub process: ChildProcess,
    /// The client port.
    pub port: u16,
    /// The Prometheus port.
    pub metrics_port: u16,
}

impl Gateway {
    /// Starts kvgate on loopback in front of `workers` with extra flags `args` (defaults:
    /// `--data-cores 1 --log-level warn --admin-api-insecure` unless `args` names them, or
    /// `--admin-api-key`); returns once its client and metrics ports accept connections.
    pub fn start(workers: &[String], args: &[&str]) -> Self {
        Self::start_logging(workers, args, None)
    }

    /// As [`Gateway::start`], with kvgate's stderr (its logs) written to `log` when given.
    /// The admin API is open (`--admin-api-insecure`) unless `args` gives `--admin-api-key`.
    pub fn start_logging(workers: &[String], args: &[&str], log: Option<std::fs::File>) -> Self {
        let admin = if args.contains(&"--admin-api-key") || args.contains(&"--admin-api-insecure") {
            &[][..]
        } else {
            &["--admin-api-insecure"][..]
        };
        Self::launch(workers, &[args, admin].concat(), log)
    }

    /// As [`Gateway::start`] with kvgate's own default for the admin API: closed (403).
    pub fn start_admin_closed(workers: &[String], args: &[&str]) -> Self {
        Self::launch(workers, args, None)
    }

    fn launch(workers: &[String], args: &[&str], log: Option<std::fs::File>) -> Self {
        // A free port can be taken by another test before kvgate binds it; kvgate then refuses
        // to start (it never shares a port), so a start that exits is retried on fresh ports.
        for attempt in 1.. {
            let file = log
                .as_ref()
                .map(|f| f.try_clone().expect("clone the log file"));
            match Self::launch_once(workers, args, file) {
                Ok(gateway) => return gateway,
                Err(why) if attempt < 3 => eprintln!("kvgate start {attempt}: {why}; again"),
                Err(why) => panic!("{why}"),
            }
        }
        unreachable!("the loop returns or panics")
    }

    fn launch_once(
        workers: &[String],
        args: &[&str],
        log: Option<std::fs::File>,
    ) -> Result<Self, String> {
        let (port, metrics_port) = (free_port(), free_port());
        let mut command = Command::new(workspace_bin("kvgate"));
        command
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                &metrics_port.to_string(),
            ])
            .args(args)
            .stdout(Stdio::null());
        // Defaults a test can override by passing the flag itself.
        for (flag, value) in [("--data-cores", "1"), ("--log-level", "warn")] {
            if !args.contains(&flag) {
                command.args([flag, value]);
            }
        }
        command.arg("--worker-urls").args(workers);
        let mut process = match log {
            Some(file) => ChildProcess::spawn_with_stderr("kvgate", &mut command, file.into()),
            None => ChildProcess::spawn("kvgate", &mut command),
        };
        // A model's tokenizer takes seconds to load in a debug build on a loaded machine.
        let wait = match args.contains(&"--tokenizer-path") {
            true => 6 * TIMEOUT,
            false => TIMEOUT,
        };
        if !wait_for_port(port, wait) || !wait_for_port(metrics_port, TIMEOUT) {
            let why = format!("kvgate did not listen on {port} and {metrics_port}");
            match process.wait_exit(Duration::from_millis(100)) {
                Some(status) => return Err(format!("{why}: it exited, {status}")),
                None => panic!("{why} and still runs"),
            }
        }
        Ok(Gateway {
            process,
            port,
            metrics_port,
        })
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    /// A new client connection to the gateway.
    pub fn client(&self) -> HttpClient {
        HttpClient::connect(self.addr())
    }

    /// The Prometheus text of `/metrics`.
    pub fn metrics(&self) -> String {
        let mut client = HttpClient::connect(([127, 0, 0, 1], self.metrics_port).into());
        client.get("/metrics").text()
    }

    /// The value of an unlabelled or fully labelled series in `/metrics` (0 when absent).
    pub fn metric(&self, series: &str) -> f64 {
        self.metric_value(series).unwrap_or(0.0)
    }

    /// The value of an unlabelled or fully labelled series in `/metrics`, if it is there.
    pub fn metric_value(&self, series: &str) -> Option<f64> {
        self.metrics()
            .lines()
            .filter_map(|line| line.strip_prefix(series))
            .filter_map(|rest| rest.strip_prefix(' '))
            .find_map(|value| value.trim().parse().ok())
    }

    /// The sum of every series of the family `name` in `/metrics`, whatever its labels.
    pub fn metric_sum(&self, name: &str) -> f64 {
        let (labelled, bare) = (format!("{name}{{"), format!("{name} "));
        self.metrics()
            .lines()
            .filter(|l| l.starts_with(&labelled) || l.starts_with(&bare))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The sum of the series of the family `name` in `/metrics` whose labels include `label`
    /// (`worker="http://..."`), whatever their other labels.
    pub fn metric_sum_where(&self, name: &str, label: &str) -> f64 {
        let labelled = format!("{name}{{");
        self.metrics()
            .lines()
            .filter_map(|l| l.strip_prefix(&labelled))
            .filter_map(|rest| rest.split_once("} "))
            .filter(|(labels, _)| labels.split(',').any(|l| l == label))
            .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
            .sum()
    }

    /// `method path` with a JSON body on a new connection, with `Authorization: Bearer <key>`
    /// when `bearer` is given (the admin API's key).
    pub fn request(&self, method: &str, path: &str, body: &str, bearer: Option<&str>) -> Response {
        let authorization = bearer.map(|key| format!("Bearer {key}"));
        let mut headers = vec![JSON];
        if let Some(authorization) = &authorization {
            headers.push(("authorization", authorization));
        }
        self.client()
            .request(method, path, &headers, body.as_bytes())
    }

    /// The `GET /workers` body as text.
    pub fn workers_json(&self) -> String {
        self.request("GET", "/workers", "", None).text()
    }

    /// Field `field` of the worker `url` in `GET /workers`, if it is listed.
    fn worker_field(&self, url: &str, field: &str) -> Option<serde_json::Value> {
        let workers: serde_json::Value = serde_json::from_str(&self.workers_json()).ok()?;
        workers["workers"]
            .as_array()?
            .iter()
            .find(|w| w["url"] == url)
            .map(|w| w[field].clone())
    }

    /// Whether `GET /workers` lists `url` as healthy.
    pub fn worker_healthy(&self, url: &str) -> bool {
        self.worker_field(url, "healthy") == Some(serde_json::Value::Bool(true))
    }

    /// The circuit breaker state `GET /workers` lists for `url` (empty when not listed).
    pub fn breaker_state(&self, url: &str) -> String {
        self.worker_field(url, "circuit_breaker")
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }

    /// A client that disconnects mid-response: POSTs `body` on a new connection, waits for the
    /// head and the first bytes of the body (a streamed answer is under way), then hangs up.
    /// Returns the status of the head.
    pub fn post_and_hang_up(&self, path: &str, body: &str) -> u16 {
        let mut client = self.client();
        client.send_request("POST", path, &[JSON], body.as_bytes());
        let status = client.read_head_and_first_chunk();
        client.close();
        status
    }
}
