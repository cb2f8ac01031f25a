//! Shutdown signals without a signal handler: `ShutdownSignals::block` blocks SIGINT and SIGTERM
//! in the calling thread before any other thread starts (so every thread inherits the mask and
//! none is interrupted), and `wait` takes the next one synchronously with `sigwait`. This is the
//! only `unsafe` outside the I/O layer's dependencies; the integration test that sends SIGTERM
//! to a running gateway and expects a clean exit covers it.

/// SIGINT and SIGTERM, blocked in this process and awaited by `wait`.
#[derive(Debug)]
pub struct ShutdownSignals {
    set: libc::sigset_t,
}

impl ShutdownSignals {
    /// Blocks SIGINT and SIGTERM in the calling thread. Call before spawning threads.
    pub fn block() -> std::io::Result<Self> {
        // SAFETY: `sigset_t` is a plain C bit set for which all-zero bytes are a valid value;
        // `sigemptyset` initialises it properly right after.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, exclusively borrowed `sigset_t`; the signal numbers are
        // valid constants; a null old-mask pointer is allowed by `pthread_sigmask`.
        let rc = unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        Ok(ShutdownSignals { set })
    }

    /// Blocks until SIGINT or SIGTERM arrives; returns its number.
    pub fn wait(&self) -> i32 {
        let mut signal = 0;
        loop {
            // SAFETY: `self.set` was initialised by `block`; `signal` is a valid out pointer.
            let rc = unsafe { libc::sigwait(&self.set, &mut signal) };
            if rc == 0 {
                return signal;
            }
        }
    }
}
