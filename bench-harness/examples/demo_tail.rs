//! `make demo`'s workload on the simulated engines' model alone, in simulated time (no sockets,
//! no sleeping, so the machine's load does not move a figure): a closed loop of clients over N
//! engines, each request routed either in turn (round robin) or to the engine that holds its
//! group's system prompt (what cache_aware does on this workload: every request after a
//! group's first matches 94% of its tokens), and per request its TTFT, its gaps between tokens
//! and its end-to-end time, with each engine's steps (kind, batch, duration):
//!
//! ```text
//! cargo run --release -p bench-harness --example demo_tail -- [REQUESTS] [--seed N]
//!     [--decode-pool-tokens N] [--prefill-constant-ms MS] [--margin N]
//! ```
//!
//! It answered why cache_aware's E2E p99 and ITL p50 were worse than round robin's in the demo
//! (perf/results-routing-2.md): the requests an engine decodes and the prefills that stall them.

use bench_harness::sim::cost::CostModel;
use bench_harness::sim::{Engine, EngineConfig, SimRequest};

/// The demo's shape (`replay compare` defaults with `--synthetic`).
const ENGINES: usize = 4;
const CLIENTS: usize = 8;
const GROUPS: u64 = 32;
const SYSTEM_TOKENS: u32 = 2048;
const QUESTION_TOKENS: u32 = 128;
const OUTPUT_TOKENS: u32 = 32;
const KV_CAPACITY_TOKENS: u64 = 32_768;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Routing {
    RoundRobin,
    Affinity,
    /// Affinity under kvgate's `--bounded-load-margin` (`cache_aware::bounded_load`; 8 unless
    /// `--margin` says): the least-routed holder whose count stays within the margin of the
    /// mean, else the least-routed engine below the mean (if it has no more in flight than the
    /// least-busy holder or the mean), which becomes a holder.
    Bounded,
}

/// `--bounded-load-margin` of [`Routing::Bounded`] unless `--margin` says.
const BOUNDED_MARGIN_DEFAULT: f64 = 8.0;

#[derive(Default)]
struct Figures {
    ttft_us: Vec<u64>,
    gaps_us: Vec<u64>,
    e2e_us: Vec<u64>,
    /// First token to last, per request.
    decode_us: Vec<u64>,
    /// Per request: E2E, prefill steps while it decoded, their time.
    stalls: Vec<(u64, u64, u64)>,
    /// Per engine: decode steps, summed decode batch, prefill steps.
    steps: Vec<[u64; 3]>,
    routed: Vec<u64>,
}

struct InFlight {
    engine: usize,
    id: u64,
    arrival_us: u64,
    first_us: u64,
    last_us: u64,
    /// Prefill steps of its engine between its first token and its last, and their time.
    stalls: u64,
    stalled_us: u64,
}

/// xorshift: the request stream is the same for both routings.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn request(n: u64, group: u64) -> SimRequest {
    let mut tokens: Vec<u32> = (0..SYSTEM_TOKENS)
        .map(|i| (group as u32) * 100_000 + i)
        .collect();
    tokens.extend((0..QUESTION_TOKENS).map(|i| 50_000_000 + (n as u32) * 1000 + i));
    SimRequest {
        namespace: 0,
        tokens,
        max_new_tokens: OUTPUT_TOKENS,
        output_seed: n,
        prefilled: false,
    }
}

fn run(routing: Routing, requests: u64, cost: CostModel, seed: u64, margin: f64) -> Figures {
    let config = EngineConfig {
        kv_capacity_tokens: KV_CAPACITY_TOKENS,
        cost,
        ..EngineConfig::default()
    };
    let mut engines: Vec<Engine> = (0..ENGINES).map(|_| Engine::new(config.clone())).collect();
    let mut ends: Vec<Option<u64>> = vec![None; ENGINES];
    let mut figures = Figures {
        steps: vec![[0; 3]; ENGINES],
        routed: vec![0; ENGINES],
        ..Figures::default()
    };
    let mut home: Vec<Option<usize>> = vec![None; GROUPS as usize];
    let mut holders: Vec<Vec<usize>> = vec![Vec::new(); GROUPS as usize];
    let mut in_flight: Vec<InFlight> = Vec::new();
    let (mut sent, mut done, mut cursor, mut rng) = (0u64, 0u64, 0usize, 0x9e37_79b9u64 ^ seed);
    let mut now = 0u64;
    let mut send = |engines: &mut Vec<Engine>,
                    in_flight: &mut Vec<InFlight>,
                    ends: &mut Vec<Option<u64>>,
                    figures: &mut Figures,
                    now: u64,
                    sent: &mut u64| {
        let group = next(&mut rng) % GROUPS;
        let engine = match routing {
            Routing::RoundRobin => {
                cursor = (cursor + 1) % ENGINES;
                cursor
            }
            Routing::Affinity => *home[group as usize].get_or_insert_with(|| {
                // A new prefix goes to the engine with the fewest requests in flight.
                (0..ENGINES)
                    .min_by_key(|e| in_flight.iter().filter(|f| f.engine == *e).count())
                    .unwrap_or(0)
            }),
            Routing::Bounded => {
                let busy = |e: usize| in_flight.iter().filter(|f| f.engine == e).count();
                let held = &mut holders[group as usize];
                let routed = &figures.routed;
                let mean = routed.iter().sum::<u64>() as f64 / ENGINES as f64;
                let within = |e: &usize| routed[*e] as f64 + 1.0 <= mean + margin;
                let engine = if held.is_empty() {
                    (0..ENGINES).min_by_key(|e| busy(*e)).unwrap_or(0)
                } else if let Some(e) = held
                    .iter()
                    .copied()
                    .filter(within)
                    .min_by_key(|e| routed[*e])
                {
                    e
                } else {
                    let least_busy = held.iter().map(|e| busy(*e)).min().unwrap_or(0) as f64;
                    let limit = least_busy.max(in_flight.len() as f64 / ENGINES as f64);
                    (0..ENGINES)
                        .filter(|e| (routed[*e] as f64) < mean && busy(*e) as f64 <= limit)
                        .min_by_key(|e| routed[*e])
                        .unwrap_or_else(|| {
                            held.iter().copied().min_by_key(|e| busy(*e)).unwrap_or(0)
                        })
                };
                if !held.contains(&engine) {
                    held.push(engine);
                }
                engine
            }
        };
        let id = engines[engine]
            .submit_at(request(*sent, group), now)
            .expect("fits");
        in_flight.push(InFlight {
            engine,
            id,
            arrival_us: now,
            first_us: now,
            last_us: now,
            stalls: 0,
            stalled_us: 0,
        });
        figures.routed[engine] += 1;
        *sent += 1;
        if ends[engine].is_none() {
            ends[engine] = engines[engine].begin_step(now);
        }
    };
    for _ in 0..CLIENTS {
        send(
            &mut engines,
            &mut in_flight,
            &mut ends,
            &mut figures,
            now,
            &mut sent,
        );
    }
    while done < requests {
        let Some((engine, end)) = ends
            .iter()
            .enumerate()
            .filter_map(|(e, end)| end.map(|t| (e, t)))
            .min_by_key(|(_, t)| *t)
        else {
            break;
        };
        now = end;
        let running = engines[engine].loads(now).num_running_reqs;
        // Before it finishes, the engine's clock is where its step began.
        let started = engines[engine].now_us();
        let emits = engines[engine].finish_step();
        let prefill =
            emits.iter().any(|e| e.completion_tokens == 1) || emits.len() as u64 != running;
        let mut finished = 0;
        for emit in &emits {
            let Some(at) = in_flight
                .iter()
                .position(|f| f.engine == engine && f.id == emit.id)
            else {
                continue;
            };
            let flight = &mut in_flight[at];
            if emit.completion_tokens == 1 {
                figures.ttft_us.push(emit.at_us - flight.arrival_us);
                flight.first_us = emit.at_us;
            } else {
                figures.gaps_us.push(emit.at_us - flight.last_us);
            }
            flight.last_us = emit.at_us;
            if emit.finished {
                figures.e2e_us.push(emit.at_us - flight.arrival_us);
                figures.decode_us.push(emit.at_us - flight.first_us);
                figures.stalls.push((
                    emit.at_us - flight.arrival_us,
                    flight.stalls,
                    flight.stalled_us,
                ));
                in_flight.swap_remove(at);
                finished += 1;
            }
        }
        if prefill {
            figures.steps[engine][2] += 1;
            for flight in in_flight
                .iter_mut()
                .filter(|f| f.engine == engine && f.first_us > f.arrival_us)
            {
                flight.stalls += 1;
                flight.stalled_us += now - started;
            }
        } else {
            figures.steps[engine][0] += 1;
            figures.steps[engine][1] += emits.len() as u64;
        }
        ends[engine] = None;
        for _ in 0..finished {
            done += 1;
            if sent < requests {
                send(
                    &mut engines,
                    &mut in_flight,
                    &mut ends,
                    &mut figures,
                    now,
                    &mut sent,
                );
            }
        }
        if ends[engine].is_none() {
            ends[engine] = engines[engine].begin_step(now);
        }
    }
    figures
}

fn percentile(values: &mut [u64], p: f64) -> f64 {
    values.sort_unstable();
    if values.is_empty() {
        return 0.0;
    }
    let i = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[i] as f64 / 1000.0
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let requests = args.first().and_then(|a| a.parse().ok()).unwrap_or(1500);
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|a| a.parse::<f64>().ok())
    };
    let mut cost = CostModel::default();
    let seed = flag("--seed").map_or(0, |s| s as u64);
    let margin = flag("--margin").unwrap_or(BOUNDED_MARGIN_DEFAULT);
    if let Some(tokens) = flag("--decode-pool-tokens") {
        cost.decode_pool_tokens = tokens as u64;
    }
    if let Some(ms) = flag("--prefill-constant-ms") {
        cost.prefill_constant_ms = ms;
    }
    println!(
        "{:12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  per engine: decode steps / mean batch / prefill steps",
        "routing", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "decode p99", "E2E p50", "E2E p99", "E2E max"
    );
    for routing in [Routing::RoundRobin, Routing::Affinity, Routing::Bounded] {
        let mut f = run(routing, requests, cost, seed, margin);
        let engines: Vec<String> = f
            .steps
            .iter()
            .map(|s| {
                let batch = s[1] as f64 / s[0].max(1) as f64;
                format!("{}/{batch:.2}/{}", s[0], s[2])
            })
            .collect();
        println!(
            "{:12} {:>9.1} {:>9.1} {:>9.3} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}  {}  routed {:?}",
            format!("{routing:?}"),
            percentile(&mut f.ttft_us, 0.5),
            percentile(&mut f.ttft_us, 0.99),
            percentile(&mut f.gaps_us, 0.5),
            percentile(&mut f.gaps_us, 0.99),
            percentile(&mut f.decode_us, 0.99),
            percentile(&mut f.e2e_us, 0.5),
            percentile(&mut f.e2e_us, 0.99),
            percentile(&mut f.e2e_us, 1.0),
            engines.join("  "),
            f.routed
        );
        f.stalls.sort_unstable();
        let tail = &f.stalls[f.stalls.len() * 99 / 100..];
        let body = &f.stalls[..f.stalls.len() / 2];
        let mean = |v: &[(u64, u64, u64)], i: usize| {
            v.iter().map(|t| [t.0, t.1, t.2][i] as f64).sum::<f64>() / v.len().max(1) as f64
        };
        let gaps = f.gaps_us.len().max(1) as f64;
        println!(
            "    ITL mean {:.3} ms, p25 {:.3}, p75 {:.3}; imbalance {:.3}",
            f.gaps_us.iter().sum::<u64>() as f64 / gaps / 1000.0,
            percentile(&mut f.gaps_us, 0.25),
            percentile(&mut f.gaps_us, 0.75),
            *f.routed.iter().max().unwrap_or(&0) as f64 * ENGINES as f64
                / f.routed.iter().sum::<u64>().max(1) as f64
        );
        println!(
            "    slowest 1%: {:.1} prefill stalls ({:.1} ms) while decoding; fastest half: {:.1} ({:.1} ms)",
            mean(tail, 1),
            mean(tail, 2) / 1000.0,
            mean(body, 1),
            mean(body, 2) / 1000.0
        );
    }
}
