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
# shellcheck source=lib/fleet.sh
source scripts/lib/fleet.sh
rounds="${1:-6}"
out="${2:-target/bench-observability}"
requests="${BENCH_REQUESTS:-60000}"
mkdir -p "$out"
cargo build --release -q --workspace --bins
fleet_init target/release "$out"
read -r sim_port port < <(fleet_ports 4 2)
metrics_port=$((port + 1))
FLEET_PIN=0 fleet_start_sim target/release "$sim_port" --engines 4 --instant --threads 1
workers=()
for i in 0 1 2 3; do workers+=("http://127.0.0.1:$((sim_port + i))"); done
FLEET_PIN=1 fleet_start_kvgate target/release "$port" "$metrics_port" "${workers[*]}"
kvgate_pid=$KVGATE_PID
fleet_wait sim-engine "${workers[@]/%//health}"
fleet_wait_port kvgate "$port"
sleep 2
run() { # condition (scraped | never), round
    local scraper="" before after
    if [ "$1" = scraped ]; then
        taskset -c 0 bash -c "while :; do curl -s -o /dev/null http://127.0.0.1:$metrics_port/metrics \
            && echo >>'$out/scrapes'; sleep 1; done" &
        scraper=$!
    fi
    before=$(fleet_cpu_us "$kvgate_pid")
    taskset -c 0 target/release/replay --gateway "http://127.0.0.1:$port" --synthetic --groups 64 \
        --system-prompt-len 256 --question-len 32 --output-len 4 --concurrency 32 \
        --max-requests "$requests" --seed "$2" --no-progress --out "$out/$1-$2.json" >/dev/null
    after=$(fleet_cpu_us "$kvgate_pid")
    [ -n "$scraper" ] && kill "$scraper" && wait "$scraper" 2>/dev/null || true
    python3 - "$out/$1-$2.json" "$1" "$((after - before))" <<'EOF' | tee -a "$out/runs.txt"
import json, sys
report, condition, cpu_us = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3])
n = report["successes"]
print(f"{condition} req/s {report['throughput_rps']:.0f} cpu_us/req {cpu_us / n:.1f} "
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
column() { # condition field -> that field of the condition's runs (runs.txt)
    local condition field rest
    while read -r condition rest; do
        if [ "$condition" = "$1" ]; then read -ra field <<<"$rest"; echo "${field[$2 - 2]}"; fi
    done <"$out/runs.txt"
}
declare -A median
for condition in never scraped; do
    rps=($(column "$condition" 3)); cpu=($(column "$condition" 5))
    median[$condition-rps]=$(fleet_stats median "${rps[@]}"); median[$condition-cpu]=$(fleet_stats median "${cpu[@]}")
    printf '%-8s req/s median %s (range %s-%s), CPU/request median %s us (range %s-%s)\n' "$condition" \
        "$(fleet_round 0 "${median[$condition-rps]}")" "$(fleet_stats --decimals 0 min "${rps[@]}")" \
        "$(fleet_stats --decimals 0 max "${rps[@]}")" "$(fleet_round 1 "${median[$condition-cpu]}")" \
        "$(fleet_stats --decimals 1 min "${cpu[@]}")" "$(fleet_stats --decimals 1 max "${cpu[@]}")"
done
spread() { # values... -> (max - min) / median, in percent
    local range
    range=$(fleet_stats sum "$(fleet_stats max "$@")" "-$(fleet_stats min "$@")")
    fleet_stats --decimals 1 share "$range" "$(fleet_stats median "$@")"
}
echo "scraped/never: req/s $(fleet_stats --decimals 3 ratio "${median[scraped-rps]}" "${median[never-rps]}")," \
    "CPU/request $(fleet_stats --decimals 3 ratio "${median[scraped-cpu]}" "${median[never-cpu]}")" \
    "(run-to-run spread of never: req/s $(spread $(column never 3))%, CPU/request $(spread $(column never 5))%)"
