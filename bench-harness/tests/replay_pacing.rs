//! Pacing, checked by counting scheduled send times against a fake clock (never wall-clock
//! assertions): trace timestamps honoured at a speedup (Mooncake, captured logs, token ids),
//! Poisson arrivals at their rate, and a closed loop never exceeding its concurrency.

use std::cell::Cell;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bench_harness::replay::pacing::{dispatch, Clock, Dispatch, Pacing, Schedule};
use bench_harness::replay::sharegpt::{ShareGptOptions, ShareGptWorkload};
use bench_harness::replay::synthetic::{Popularity, SyntheticSpec, SyntheticWorkload};
use bench_harness::replay::trace::{TraceFormat, TraceWorkload};
use bench_harness::replay::workload::Workload;
use tokio::sync::Semaphore;

/// A clock that jumps straight to whatever time is waited for.
#[derive(Default)]
struct FakeClock {
    now: Cell<Duration>,
}

impl Clock for FakeClock {
    fn elapsed(&self) -> Duration {
        self.now.get()
    }

    fn sleep_until(&self, at: Duration) -> impl Future<Output = ()> + Send {
        if at > self.now.get() {
            self.now.set(at);
        }
        std::future::ready(())
    }
}

/// Runs `dispatch` on the fake clock; returns (scheduled time, clock time) of every send.
fn sends(workload: &mut dyn Workload, pacing: Pacing, slots: usize) -> Vec<(Duration, Duration)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = FakeClock::default();
    let mut schedule = Schedule::new(pacing);
    let mut sent = Vec::new();
    let semaphore = Arc::new(Semaphore::new(slots));
    runtime.block_on(dispatch(
        workload,
        &mut schedule,
        &clock,
        semaphore,
        |d: Dispatch| {
            sent.push((d.scheduled, clock.elapsed()));
            drop(d.slot);
        },
    ));
    sent
}

fn count_within(sent: &[(Duration, Duration)], from_ms: f64, to_ms: f64) -> usize {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    sent.iter()
        .filter(|(_, at)| ms(*at) >= from_ms && ms(*at) < to_ms)
        .count()
}

#[test]
fn trace_timestamps_are_honoured_at_a_speedup() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/mooncake_slice.jsonl");
    let mut trace = TraceWorkload::open(&path, TraceFormat::Mooncake, false).unwrap();
    let sent = sends(&mut trace, Pacing::Trace { speedup: 1000.0 }, 64);
    assert_eq!(sent.len(), 40);
    // The slice has 10 rows at 0 ms, 16 at 3,000, 3 at 5,999, 9 at 9,000 and 2 at 12,000:
    // at 1000× they are due at 0, 3, 5.999, 9 and 12 ms.
    let windows = [
        (0.0, 0.5, 10),
        (2.9, 3.1, 16),
        (5.9, 6.1, 3),
        (8.9, 9.1, 9),
        (11.9, 12.1, 2),
    ];
    for (from, to, expected) in windows {
        assert_eq!(
            count_within(&sent, from, to),
            expected,
            "sends in [{from}, {to}) ms"
        );
    }
    // Every request left at its scheduled time, and the schedule never goes back in time.
    assert!(sent.iter().all(|(scheduled, at)| scheduled == at));
    assert!(sent.windows(2).all(|w| w[0].0 <= w[1].0));
}

#[test]
fn captured_and_token_id_timestamps_are_honoured_at_a_speedup() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let cases = [
        (
            "openai_log.jsonl",
            TraceFormat::OpenaiLog,
            vec![0, 5, 10, 20, 30, 40],
        ),
        ("token_ids.jsonl", TraceFormat::TokenIds, vec![0, 2, 10, 15]),
    ];
    for (file, format, due_ms) in cases {
        let mut trace = TraceWorkload::open(&fixtures.join(file), format, false).unwrap();
        let sent = sends(&mut trace, Pacing::Trace { speedup: 10.0 }, 64);
        let at: Vec<Duration> = sent.iter().map(|(_, at)| *at).collect();
        let due: Vec<Duration> = due_ms.into_iter().map(Duration::from_millis).collect();
        assert_eq!(at, due, "{file}: every valid line once, at its time / 10");
        assert!(sent.iter().all(|(scheduled, at)| scheduled == at));
    }
}

#[test]
fn sharegpt_has_no_timestamps_and_goes_out_as_slots_free() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/sharegpt.jsonl");
    let options = ShareGptOptions {
        active_conversations: 2,
        seed: 1,
        repeat: false,
    };
    let mut conversations = ShareGptWorkload::open(&path, options).unwrap();
    let sent = sends(&mut conversations, Pacing::Closed { concurrency: 2 }, 2);
    assert_eq!(sent.len(), 4);
    assert!(sent.iter().all(|(scheduled, _)| scheduled.is_zero()));
}

fn synthetic(requests: u64) -> SyntheticWorkload {
    let spec = SyntheticSpec {
        groups: 4,
        prompts_per_group: 4,
        system_prompt_tokens: 32,
        question_tokens: 8,
        output_tokens: 4,
        popularity: Popularity::Uniform,
        turns: 1,
        seed: 3,
        requests: Some(requests),
    };
    SyntheticWorkload::new(spec).unwrap()
}

#[test]
fn poisson_arrivals_keep_their_rate() {
    let sent = sends(
        &mut synthetic(4000),
        Pacing::Poisson {
            rate_per_s: 200.0,
            seed: 9,
        },
        64,
    );
    assert_eq!(sent.len(), 4000);
    let span_s = sent.last().unwrap().0.as_secs_f64();
    let rate = 3999.0 / span_s;
    // 4,000 exponential gaps: the mean is within a few percent of 1/200 s.
    assert!(
        (rate - 200.0).abs() < 200.0 * 0.06,
        "measured {rate:.1} req/s"
    );
    // Half the requests arrive in the first half of the span, give or take.
    let first_half = count_within(&sent, 0.0, span_s * 500.0);
    assert!((1800..2200).contains(&first_half), "{first_half}");
}

#[test]
fn a_closed_loop_sends_only_when_a_slot_is_free() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = FakeClock::default();
    let mut schedule = Schedule::new(Pacing::Closed { concurrency: 3 });
    let semaphore = Arc::new(Semaphore::new(3));
    let mut held = Vec::new();
    let mut workload = synthetic(10);
    let dispatched = runtime.block_on(async {
        let run = dispatch(
            &mut workload,
            &mut schedule,
            &clock,
            semaphore.clone(),
            |d| held.push(d.slot),
        );
        // With nobody releasing slots, exactly 3 requests go out and the loop waits.
        tokio::time::timeout(Duration::from_millis(50), run).await
    });
    assert!(
        dispatched.is_err(),
        "the closed loop must wait for a free slot"
    );
    assert_eq!(held.len(), 3);
}
