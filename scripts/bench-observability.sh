#!/usr/bin/env bash
# The cost of observability (issue 22): kvgate's req/s and CPU per request with /metrics scraped
# every second against never, in one run. One kvgate (1 data core, default cache_aware routing,
# pinned to CPU 1) in front of 4 `sim-engine --instant` engines; `replay` (closed loop, 32 in
# flight, the shared-prefix generator with short prompts so the gateway, not the load
# generator, is what is measured), the engines and the scraper on CPU 0. The two conditions
# alternate ROUNDS times; each round's kvgate CPU comes from /proc (utime+stime, the control
# core's scrapes included). Prints one line per run, then each condition's median and range.
#
#   scripts/bench-observability.sh [ROUNDS] [OUT_DIR]   (default 6 rounds, target/bench-observability;
#                                                        BENCH_REQUESTS requests a run, 60000)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-6}"
out="${2:-target/bench-observability}"
requests="${BENCH_REQUESTS:-60000}"
mkdir -p "$out"
cargo build --release -q --workspace --bins
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
sim_port=23100 port=23000 metrics_port=23090
taskset -c 0 target/release/sim-engine --engines 4 --base-port "$sim_port" --instant --threads 1 \
    >"$out/sim.log" 2>&1 &
pids+=($!)
workers=()
for i in 0 1 2 3; do workers+=("http://127.0.0.1:$((sim_port + i))"); done
taskset -c 1 target/release/kvgate --host 127.0.0.1 --port "$port" --prometheus-host 127.0.0.1 \
    --prometheus-port "$metrics_port" --data-cores 1 --log-level warn \
    --worker-urls "${workers[@]}" >"$out/kvgate.log" 2>&1 &
kvgate_pid=$!
pids+=("$kvgate_pid")
sleep 2
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
scrapes=0
run() { # condition (scraped | never), round
    local scraper="" before after
    if [ "$1" = scraped ]; then
        taskset -c 0 bash -c "while :; do curl -s -o /dev/null http://127.0.0.1:$metrics_port/metrics \
            && echo >>'$out/scrapes'; sleep 1; done" &
        scraper=$!
    fi
    before=$(ticks "$kvgate_pid")
    taskset -c 0 target/release/replay --gateway "http://127.0.0.1:$port" --synthetic --groups 64 \
        --system-prompt-len 256 --question-len 32 --output-len 4 --concurrency 32 \
        --max-requests "$requests" --seed "$2" --no-progress --out "$out/$1-$2.json" >/dev/null
    after=$(ticks "$kvgate_pid")
    [ -n "$scraper" ] && kill "$scraper" && wait "$scraper" 2>/dev/null || true
    python3 - "$out/$1-$2.json" "$1" "$((after - before))" "$(getconf CLK_TCK)" <<'EOF' | tee -a "$out/runs.txt"
import json, sys
report, condition, ticks, hz = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
n = report["successes"]
print(f"{condition} req/s {report['throughput_rps']:.0f} cpu_us/req {ticks / hz * 1e6 / n:.1f} "
      f"errors {report['errors']} duration_s {report['duration_s']:.1f}")
EOF
}
: >"$out/runs.txt"; : >"$out/scrapes"
echo "# $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD), load average $(cut -d' ' -f1-3 /proc/loadavg), $requests requests a run"
# Warm-up (connections, trees), not counted.
taskset -c 0 target/release/replay --gateway "http://127.0.0.1:$port" --synthetic \
    --groups 64 --system-prompt-len 256 --question-len 32 --output-len 4 --concurrency 32 \
    --max-requests 2000 --no-progress >/dev/null
for round in $(seq "$rounds"); do
    # Alternate which condition goes first, so a drift in the box's load hits both alike.
    if [ $((round % 2)) = 1 ]; then run never "$round"; run scraped "$round"
    else run scraped "$round"; run never "$round"; fi
done
echo "# scrapes answered: $(wc -l <"$out/scrapes")"
python3 - "$out/runs.txt" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    runs.setdefault(f[0], []).append((float(f[2]), float(f[4])))
for condition in ("never", "scraped"):
    rps = [r for r, _ in runs[condition]]
    cpu = [c for _, c in runs[condition]]
    print(f"{condition:8} req/s median {statistics.median(rps):.0f} (range {min(rps):.0f}-{max(rps):.0f}), "
          f"CPU/request median {statistics.median(cpu):.1f} us (range {min(cpu):.1f}-{max(cpu):.1f})")
never, scraped = runs["never"], runs["scraped"]
ratio = lambda i: statistics.median(s[i] for s in scraped) / statistics.median(n[i] for n in never)
spread = lambda i: (max(n[i] for n in never) - min(n[i] for n in never)) / statistics.median(n[i] for n in never)
print(f"scraped/never: req/s {ratio(0):.3f}, CPU/request {ratio(1):.3f} "
      f"(run-to-run spread of never: req/s {spread(0):.1%}, CPU/request {spread(1):.1%})")
EOF
