#!/usr/bin/env bash
# Gateway CPU per request of a prefill/decode pair against a regular request (issue 38's target:
# at most 2x, since a pair is two upstream requests). Per round: kvgate --pd-disaggregation in
# front of 2 `sim-engine --role prefill` and 2 `--role decode` engines, and kvgate in regular mode
# in front of 2 regular engines, each with one data core; N sequential `/generate` requests
# (distinct 64-word prompts, 16 new tokens, not streamed) through each; kvgate's own CPU time
# (user + system, /proc) over those requests divided by N. Prints each round and the medians.
#
#   scripts/bench-pd.sh [ROUNDS] [N]      (defaults 3 and 400; release build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}" n="${2:-400}"
source scripts/lib/fleet.sh
fleet_build release
fleet_init target/release
bin=target/release
read -r prefill decode regular pd_port pd_metrics reg_port reg_metrics <<<"$(fleet_ports 2 2 2 1 1 1 1)"
sim=(--speedup 20 --transfer-timeout-ms 5000)
fleet_start_sim "$bin" "$prefill" --engines 2 --role prefill "${sim[@]}"
fleet_start_sim "$bin" "$decode" --engines 2 --role decode "${sim[@]}"
fleet_start_sim "$bin" "$regular" --engines 2 "${sim[@]}"
for p in "$prefill" $((prefill + 1)) "$decode" $((decode + 1)) "$regular" $((regular + 1)); do
  fleet_wait_port sim-engine "$p"
done
fleet_start kvgate-pd "$bin/kvgate" --host 127.0.0.1 --port "$pd_port" --prometheus-host 127.0.0.1 \
  --prometheus-port "$pd_metrics" --data-cores 1 --log-level warn --pd-disaggregation \
  --prefill "http://127.0.0.1:$prefill" "$prefill" --prefill "http://127.0.0.1:$((prefill + 1))" "$((prefill + 1))" \
  --decode "http://127.0.0.1:$decode" --decode "http://127.0.0.1:$((decode + 1))"
pd_pid=$FLEET_PID
fleet_start_kvgate "$bin" "$reg_port" "$reg_metrics" "http://127.0.0.1:$regular http://127.0.0.1:$((regular + 1))"
reg_pid=$KVGATE_PID
fleet_wait_port kvgate-pd "$pd_port"
fleet_wait_port kvgate "$reg_port"

# N requests through the gateway on PORT, one after another; prints kvgate PID's CPU us per request.
cpu_per_request() {
  local port="$1" pid="$2" round="$3" before after words
  words=$(printf 'word%s ' $(seq 1 64))
  before=$(fleet_cpu_us "$pid")
  for i in $(seq 1 "$n"); do
    curl -sf -o /dev/null "http://127.0.0.1:$port/generate" -H 'content-type: application/json' \
      -d "{\"text\":\"round $round request $i: $words\",\"sampling_params\":{\"max_new_tokens\":16}}"
  done
  after=$(fleet_cpu_us "$pid")
  echo $(( (after - before) / n ))
}

pd_all=() reg_all=()
for round in $(seq 1 "$rounds"); do
  pd=$(cpu_per_request "$pd_port" "$pd_pid" "$round")
  reg=$(cpu_per_request "$reg_port" "$reg_pid" "$round")
  pd_all+=("$pd") reg_all+=("$reg")
  echo "round $round: PD pair ${pd} us, regular ${reg} us per request, ratio $(fleet_stats --decimals 2 ratio "$pd" "$reg")"
done
pd_med=$(fleet_stats median "${pd_all[@]}") reg_med=$(fleet_stats median "${reg_all[@]}")
echo "median: PD pair ${pd_med} us, regular ${reg_med} us per request, ratio $(fleet_stats --decimals 2 ratio "$pd_med" "$reg_med")"
