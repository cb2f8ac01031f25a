#!/usr/bin/env bash
# The mesh's benchmark (issues 20 and 37): cache hit rate and TTFT when replay spreads requests
# round robin over several gateways (`replay --gateway URL1,URL2,...`), without and with
# --enable-mesh, on 8 simulated engines; and the mesh's cost per dispatch: bytes its frames put
# on the wire (all, and those of repairs), page hashes its deltas carried, and CPU of the
# gateways' kvgate-mesh threads, their kvgate-control threads, and the part of the latter spent
# inserting peers' paths (kvgate_mesh_apply_seconds_total); and the same CPU "above idle": less
# what those threads use without traffic (measured for IDLE_S seconds, default 5, before each
# replay, and scaled to the replay's length); the mesh threads' CPU again by schedstat
# (nanoseconds, not 10 ms ticks) and their wakes (voluntary context switches) per dispatch,
# likewise; the control threads' and the data cores' CPU by schedstat per dispatch (all of it,
# idle included: the data cores' shows what the heap's page size costs the hot path); the
# 1-minute load average at the end of each replay.
#
#   scripts/bench-mesh.sh [OUT_DIR]     (default target/bench-mesh; SKIP_BUILD=1 reuses the
#                                        binaries; about 8 minutes on 2 cores)
#   BIN=target/debug REQUESTS=200 SKIP_BUILD=1 scripts/bench-mesh.sh   (a quick check of the script)
#   RESUME=1 ...: keep the runs whose report is in OUT_DIR, run the rest
#   PERF=1 ...: perf record (999 Hz, call graphs) of the gateways during each replay, in
#       OUT_DIR/NAME.perf.data (`perf report --sort comm,symbol` splits it by thread)
#   TRACE=PATH ...: the Mooncake conversation trace (default ../shared/traces/, beside the repository)
#   RATE=10 ...: shared-prefix's and text-chat's arrival rate (default 40 req/s)
#   GW_ARGS="--balance-abs-threshold 1000000" ...: more flags for every gateway
#   CONFIGS="4 on,8 on" WORKLOADS="shared-prefix text-chat" ...: the gateway counts (with the
#       mesh on or off) and workloads to run (defaults below)
#
# Workloads:
#   shared-prefix  64 groups of 2,048-token system prompts, 8 conversations each, 64-token
#                  questions, Poisson 40 req/s, 2,000 requests, 65,536 KV tokens per engine;
#                  sent as token ids (`--form generate-ids`: the token tree, whose paths cross
#                  the mesh as page hashes).
#   mooncake       the first 2,000 rows of the Mooncake conversation trace paced 20x, engines
#                  simulated 20x faster, 2,097,152 KV tokens per engine; token ids.
#   text-chat      shared-prefix's groups sent as chat text (`--form chat`, no tokenizer: the
#                  string tree, whose paths cross as the hashes of their text's 64-byte pages,
#                  `mesh::text`; before issue 37's text sync, only as their hash).
# Each run writes OUT_DIR/NAME.json (replay's report), OUT_DIR/NAME.gwI.metrics (gateway I's
# kvgate_mesh_* series and policy branch counts at the end) and one line of OUT_DIR/summary.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/fleet.sh
source scripts/lib/fleet.sh
out="${1:-target/bench-mesh}"
mkdir -p "$out"
[ -n "${SKIP_BUILD:-}" ] || cargo build --release -p kvgate --bin kvgate -p bench-harness \
  --bin sim-engine --bin replay --bin fleet
bin="${BIN:-target/release}"
requests="${REQUESTS:-2000}"
trace="${TRACE:-../shared/traces/mooncake_conversation_trace.jsonl}"
fleet_init "$bin"

metric() { # PORT SERIES: the series' value in that gateway's /metrics (0 when absent)
  curl -s "http://127.0.0.1:$1/metrics" | awk -v s="$2" '$1 == s { print $2; found = 1 } END { if (!found) print 0 }'
}

thread_sched() { # COMM PID...: "NS WAKES": the nanoseconds on CPU (schedstat, exact, not
  # tick-based) and the voluntary context switches (sleeps, then wakes) of their threads named
  # COMM (a glob: kvgate-data-* for every data core) so far
  local comm="$1" ns=0 wakes=0 pid task
  shift
  for pid in "$@"; do
    for task in /proc/"$pid"/task/*; do
      # shellcheck disable=SC2053 # COMM is a glob on purpose
      [[ "$(cat "$task/comm" 2>/dev/null)" == $comm ]] || continue
      ns=$(( ns + $(cut -d' ' -f1 "$task/schedstat" 2>/dev/null || echo 0) ))
      wakes=$(( wakes + $(awk '/^voluntary_ctxt_switches/ { print $2 }' "$task/status" 2>/dev/null || echo 0) ))
    done
  done
  echo "$ns $wakes"
}
mesh_sched() { thread_sched kvgate-mesh "$@"; }

# run NAME GATEWAYS MESH(on|off) SIM_ARGS -- REPLAY_ARGS...
run() {
  local name="$1" n="$2" mesh="$3"
  shift 3
  local sim_args=()
  while [ "$1" != "--" ]; do sim_args+=("$1"); shift; done
  shift
  if [ -n "${RESUME:-}" ] && [ -s "$out/$name.json" ]; then return 0; fi
  local base mesh_base gw_base metrics_base
  read -r base mesh_base gw_base metrics_base < <(fleet_ports 8 "$n" "$n" "$n")
  fleet_start_sim "$bin" "$base" --engines 8 "${sim_args[@]}"
  local workers=() i
  for i in $(seq 0 7); do workers+=("http://127.0.0.1:$((base + i))"); done
  fleet_wait sim-engine "${workers[@]/%//health}"
  local urls=() metrics_ports=() gw_pids=() first_mesh=$mesh_base
  for i in $(seq 0 $((n - 1))); do
    local port=$((gw_base + i)) mport=$((metrics_base + i)) meshport=$((mesh_base + i))
    local args=(--host 127.0.0.1 --port "$port" --prometheus-host 127.0.0.1
      --prometheus-port "$mport" --data-cores 1 --log-level warn --worker-urls "${workers[@]}")
    # shellcheck disable=SC2206 # GW_ARGS is split on spaces on purpose
    [ -n "${GW_ARGS:-}" ] && args+=(${GW_ARGS})
    if [ "$mesh" = on ]; then
      args+=(--enable-mesh --mesh-host 127.0.0.1 --mesh-port "$meshport")
      [ "$i" -gt 0 ] && args+=(--mesh-peer-urls "127.0.0.1:$first_mesh")
    fi
    fleet_start "kvgate-$i" "$bin/kvgate" "${args[@]}"
    gw_pids+=("$FLEET_PID")
    urls+=("http://127.0.0.1:$port")
    metrics_ports+=("$mport")
  done
  for i in $(seq 0 $((n - 1))); do fleet_wait_port "kvgate-$i" $((gw_base + i)); done
  if [ "$mesh" = on ]; then
    for mport in "${metrics_ports[@]}"; do
      for _ in $(seq 300); do
        [ "$(metric "$mport" 'kvgate_mesh_peers{state="alive"}')" = "$((n - 1))" ] && break
        sleep 0.1
      done
    done
  fi
  # The threads' idle CPU (timers, SWIM, health and load probes) over IDLE_S seconds without
  # traffic, subtracted pro rata from the replay's: what remains is the dispatches' cost.
  local mesh_before control_before idle_s="${IDLE_S:-5}" idle_mesh idle_control started ended
  local sched_before sched_after idle_ns idle_wakes
  mesh_before=$(fleet_cpu_us --thread kvgate-mesh "${gw_pids[@]}")
  control_before=$(fleet_cpu_us --thread kvgate-control "${gw_pids[@]}")
  read -r -a sched_before < <(mesh_sched "${gw_pids[@]}")
  sleep "$idle_s"
  idle_mesh=$(( $(fleet_cpu_us --thread kvgate-mesh "${gw_pids[@]}") - mesh_before ))
  idle_control=$(( $(fleet_cpu_us --thread kvgate-control "${gw_pids[@]}") - control_before ))
  read -r -a sched_after < <(mesh_sched "${gw_pids[@]}")
  idle_ns=$(( sched_after[0] - sched_before[0] )); idle_wakes=$(( sched_after[1] - sched_before[1] ))
  mesh_before=$(fleet_cpu_us --thread kvgate-mesh "${gw_pids[@]}")
  control_before=$(fleet_cpu_us --thread kvgate-control "${gw_pids[@]}")
  read -r -a sched_before < <(mesh_sched "${gw_pids[@]}")
  local data_before control_sched_before
  read -r data_before _ < <(thread_sched 'kvgate-data-*' "${gw_pids[@]}")
  read -r control_sched_before _ < <(thread_sched kvgate-control "${gw_pids[@]}")
  started=$(date +%s%N)
  local perf_pid=
  if [ -n "${PERF:-}" ]; then
    perf record -q -F 999 -g -p "$(IFS=,; echo "${gw_pids[*]}")" -o "$out/$name.perf.data" \
      2>"$out/$name.perf.log" &
    perf_pid=$!
  fi
  echo "== $name: replay --gateway $(IFS=,; echo "${urls[*]}") $*" >&2
  "$bin/replay" --gateway "$(IFS=,; echo "${urls[*]}")" "$@" --no-progress \
    --out "$out/$name.json" --plot "$out/$name.svg" >"$out/$name.txt"
  ended=$(date +%s%N)
  if [ -n "$perf_pid" ]; then kill -INT "$perf_pid"; wait "$perf_pid" || true; fi
  local mesh_cpu control_cpu bytes=0 repair=0 pages=0 apply=0 dispatches=0
  mesh_cpu=$(( $(fleet_cpu_us --thread kvgate-mesh "${gw_pids[@]}") - mesh_before ))
  control_cpu=$(( $(fleet_cpu_us --thread kvgate-control "${gw_pids[@]}") - control_before ))
  local sched_ns wakes load
  read -r -a sched_after < <(mesh_sched "${gw_pids[@]}")
  sched_ns=$(( sched_after[0] - sched_before[0] )); wakes=$(( sched_after[1] - sched_before[1] ))
  local data_ns control_ns
  read -r data_ns _ < <(thread_sched 'kvgate-data-*' "${gw_pids[@]}")
  read -r control_ns _ < <(thread_sched kvgate-control "${gw_pids[@]}")
  data_ns=$(( data_ns - data_before )); control_ns=$(( control_ns - control_sched_before ))
  load=$(cut -d' ' -f1 /proc/loadavg)
  for i in "${!metrics_ports[@]}"; do # each gateway's mesh series, for a closer look
    curl -s "http://127.0.0.1:${metrics_ports[$i]}/metrics" | grep -E '^(kvgate_mesh_|smg_cache_aware_policy_branch_total)' >"$out/$name.gw$i.metrics" || true
  done
  for mport in "${metrics_ports[@]}"; do
    bytes=$(fleet_stats sum "$bytes" "$(metric "$mport" kvgate_mesh_sent_bytes_total)")
    repair=$(fleet_stats sum "$repair" "$(metric "$mport" kvgate_mesh_sent_repair_bytes_total)")
    pages=$(fleet_stats sum "$pages" "$(metric "$mport" kvgate_mesh_sent_pages_total)")
    apply=$(fleet_stats sum "$apply" "$(metric "$mport" kvgate_mesh_apply_seconds_total)")
    dispatches=$(fleet_stats sum "$dispatches" "$(metric "$mport" kvgate_dispatch_records_applied_total)")
  done
  python3 - "$out/$name.json" "$name" "$n" "$mesh" "$bytes" "$repair" "$pages" "$dispatches" \
    "$mesh_cpu" "$control_cpu" "$apply" "$idle_mesh" "$idle_control" "$idle_s" \
    "$(( (ended - started) / 1000 ))" "$wakes" "$idle_wakes" "$load" "$sched_ns" "$idle_ns" "$data_ns" "$control_ns" <<'EOF' | tee -a "$out/summary.txt"
import json, sys
path, name, n, mesh = sys.argv[1:5]
(sent, repair, pages, dispatches, mesh_us, control_us, apply_s, idle_mesh_us, idle_control_us,
 idle_s, replay_us, wakes, idle_wakes, load, sched_ns, idle_ns, data_ns, control_ns) = map(
    float, sys.argv[5:])
r = json.load(open(path))
d = max(dispatches, 1.0)
scale = replay_us / (idle_s * 1e6)
print(f"{name:28s} gateways {n} mesh {mesh:3s} hit {r['cache_hit_rate']:.1%} "
      f"TTFT p50 {r['ttft_ms']['p50']:.0f} p99 {r['ttft_ms']['p99']:.0f} ms "
      f"errors {r.get('errors', 0)} dispatches {d:.0f}  per dispatch: "
      f"sent {sent / d:.0f} B (repair {repair / d:.0f} B, {pages / d:.1f} pages), "
      f"CPU mesh thread {mesh_us / d:.0f} us, control thread {control_us / d:.0f} us "
      f"(applying peers' paths {apply_s * 1e6 / d:.0f} us); above idle: mesh thread "
      f"{(mesh_us - idle_mesh_us * scale) / d:.0f} us, control thread "
      f"{(control_us - idle_control_us * scale) / d:.0f} us; mesh thread wakes "
      f"{wakes / d:.2f} ({(wakes - idle_wakes * scale) / d:.2f} above idle); mesh thread CPU "
      f"by schedstat {sched_ns / 1e3 / d:.1f} us ({(sched_ns - idle_ns * scale) / 1e3 / d:.1f} "
      f"above idle; idle: {idle_ns / 1e3 / max(idle_wakes, 1.0):.1f} us per wake); by schedstat, "
      f"control thread {control_ns / 1e3 / d:.1f} us, data cores {data_ns / 1e3 / d:.1f} us; "
      f"load {load:.1f}")
EOF
  fleet_kill_all
}

[ -n "${RESUME:-}" ] || : >"$out/summary.txt"
configs="${CONFIGS:-1 off,2 off,2 on,4 off,4 on}"
workloads="${WORKLOADS:-shared-prefix mooncake}"
synthetic=(--synthetic --groups 64 --prompts-per-group 8 --system-prompt-len 2048
  --question-len 64 --output-len 16 --max-requests "$requests" --rate "${RATE:-40}")
mooncake=(--trace "$trace" --max-requests "$requests" --speedup 20 --form generate-ids)
IFS=, read -r -a config_list <<<"$configs"
for workload in $workloads; do
  for config in "${config_list[@]}"; do
    set -- $config
    case "$workload" in
      shared-prefix) run "shared-prefix-$1gw-mesh-$2" "$1" "$2" --kv-capacity-tokens 65536 \
        --speedup 1 -- "${synthetic[@]}" --form generate-ids ;;
      text-chat) run "text-chat-$1gw-mesh-$2" "$1" "$2" --kv-capacity-tokens 65536 \
        --speedup 1 -- "${synthetic[@]}" --form chat ;;
      mooncake) run "mooncake-$1gw-mesh-$2" "$1" "$2" --kv-capacity-tokens 2097152 \
        --speedup 20 -- "${mooncake[@]}" ;;
      *) echo "unknown workload $workload" >&2; exit 2 ;;
    esac
  done
done
cat "$out/summary.txt"
