//! The tokenizer pool: [`TOKENIZER_POOL_THREADS`] threads (`kvgate-tokenize-N`) that run cold
//! tokenization off the data cores. Each data core's runtime has a [`PoolHandle`] attached, so
//! `monoio::spawn_blocking` in the request driver queues the work here and the request's task
//! awaits it while the core serves its other connections (monoio's `sync` feature wakes the
//! task across threads).
//!
//! The queue is bounded ([`TOKENIZER_QUEUE_CAPACITY`], all cores together) and the data core
//! never waits to enqueue: work that finds it full is dropped, which monoio reports to the
//! waiting task as cancelled, and that request routes on its text (counted as refused).

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use monoio::blocking::{BlockingTask, ThreadPool};

use super::StartError;
use crate::limits::{TOKENIZER_POOL_THREADS, TOKENIZER_QUEUE_CAPACITY};

/// A data core's end of the pool's queue.
#[derive(Clone, Debug)]
pub struct PoolHandle {
    queue: SyncSender<BlockingTask>,
}

impl ThreadPool for PoolHandle {
    fn schedule_task(&self, task: BlockingTask) {
        // Full (or the pool gone): the task is dropped, which finishes it as cancelled.
        let _ = self.queue.try_send(task);
    }
}

/// Starts the pool's threads; they exit when every handle is dropped.
pub fn start() -> Result<PoolHandle, StartError> {
    let (queue, jobs) = sync_channel(TOKENIZER_QUEUE_CAPACITY);
    // The threads share one receiver; only they take its lock, never a data core.
    let jobs = Arc::new(Mutex::new(jobs));
    for n in 0..TOKENIZER_POOL_THREADS {
        let jobs = jobs.clone();
        std::thread::Builder::new()
            .name(format!("kvgate-tokenize-{n}"))
            .spawn(move || run_jobs(&jobs))
            .map_err(|e| StartError(format!("cannot start the tokenizer pool: {e}")))?;
    }
    Ok(PoolHandle { queue })
}

#[cfg(test)]
impl PoolHandle {
    /// A handle on a queue of the test's choosing.
    fn on_queue(queue: SyncSender<BlockingTask>) -> PoolHandle {
        PoolHandle { queue }
    }
}

fn run_jobs(jobs: &Mutex<Receiver<BlockingTask>>) {
    loop {
        let job = match jobs.lock() {
            Ok(receiver) => receiver.recv(),
            Err(_) => return,
        };
        match job {
            Ok(job) => job.run(),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(pool: PoolHandle) -> monoio::Runtime<monoio::LegacyDriver> {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .attach_thread_pool(Box::new(pool))
            .build()
            .expect("a runtime")
    }

    #[test]
    fn work_runs_on_the_pool_and_wakes_the_waiting_task() {
        let pool = start().expect("the pool starts");
        let core = std::thread::current().id();
        let answer = runtime(pool).block_on(async move {
            monoio::spawn_blocking(move || std::thread::current().id() != core).await
        });
        assert!(matches!(answer, Ok(true)), "ran on another thread");
    }

    #[test]
    fn work_that_finds_the_queue_full_is_cancelled_at_once() {
        // A queue of one place that nobody reads: the second task finds it full.
        let (queue, _jobs) = sync_channel(1);
        let answers = runtime(PoolHandle::on_queue(queue)).block_on(async {
            let first = monoio::spawn_blocking(|| 1);
            let second = monoio::spawn_blocking(|| 2).await;
            drop(first);
            second
        });
        assert!(answers.is_err(), "the refused task reports cancelled");
    }
}
