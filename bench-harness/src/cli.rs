//! What every bench-harness binary does the same way: start its tokio runtime ([`runtime`]) and
//! end with one exit-code convention ([`exit_with`], [`Failure`]):
//!
//! - 0: the run finished (and the check it makes held);
//! - [`EXIT_FAILED`] (1): the run or its check failed: a violation, a request error, a process
//!   that did not come up;
//! - [`EXIT_USAGE`] (2): the command line or the setup is wrong (a flag, a missing file or
//!   binary, no runtime): nothing was measured. clap exits with 2 for a bad flag too.

/// The run, or the check it makes, failed.
pub const EXIT_FAILED: i32 = 1;

/// The command line or the setup is wrong: nothing ran.
pub const EXIT_USAGE: i32 = 2;

/// Why a binary stops: the message it prints and the exit code that goes with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    /// The run or its check failed ([`EXIT_FAILED`]).
    pub fn run(message: impl Into<String>) -> Self {
        Failure {
            code: EXIT_FAILED,
            message: message.into(),
        }
    }

    /// The command line or the setup is wrong ([`EXIT_USAGE`]).
    pub fn usage(message: impl Into<String>) -> Self {
        Failure {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }
}

/// How many threads a binary's runtime runs its tasks on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threads {
    /// The calling thread only.
    Current,
    /// A pool of this many (tokio's default, one per CPU, when `None`).
    Pool(Option<usize>),
}

/// The binary's tokio runtime, with I/O and timers; exits with [`EXIT_USAGE`] if it cannot
/// start.
pub fn runtime(threads: Threads) -> tokio::runtime::Runtime {
    let built = match threads {
        Threads::Current => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Threads::Pool(count) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            if let Some(count) = count {
                builder.worker_threads(count);
            }
            builder.enable_all().build()
        }
    };
    built.unwrap_or_else(|e| {
        exit_with(&Failure::usage(format!(
            "cannot start the tokio runtime: {e}"
        )))
    })
}

/// Prints `Error: <message>` to stderr and exits with the failure's code.
pub fn exit_with(failure: &Failure) -> ! {
    eprintln!("Error: {}", failure.message);
    std::process::exit(failure.code);
}

/// Exits as [`exit_with`] on an error; returns on success.
pub fn exit_on_error(result: Result<(), Failure>) {
    if let Err(failure) = result {
        exit_with(&failure);
    }
}
