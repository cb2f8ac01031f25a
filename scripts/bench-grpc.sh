#!/usr/bin/env bash
# Gateway CPU per output token and per request, and the TTFT the gateway adds, in gRPC mode
# against HTTP mode (issue 36's benchmark; perf/results-grpc.md). One sim-engine configuration
# run twice side by side: 2 engines over HTTP and 2 over gRPC (SGLang's protocol, generating
# Qwen3's token IDs); three kvgates with one data core each, release build:
#   http      in front of the HTTP engines, no tokenizer (it relays the engines' SSE chunks);
#   http-tok  the same with Qwen3's tokenizer (it tokenizes the prompt to route on its IDs);
#   grpc      in front of the gRPC engines as their front end (renders, tokenizes, sends IDs,
#             detokenizes and frames every token), with Qwen3's tokenizer.
# Every engine decodes one token per 20 ms for every running request (a flat decode cost) and
# prefills in about 1 ms, so the engines' share is the same in each mode.
#
# 1. Streams: per round, the three gateways in turn (the order rotates each round), 64
#    concurrent streamed chats of 256 output tokens; the gateway's CPU time (user + system,
#    /proc, all its threads) over the batch, divided by 64 x 256 tokens and by 64 requests.
# 2. TTFT: a chat with a ~2k-token system prompt, sent once to each gateway to cache its head
#    (the engines' prefix cache, the gateways' token caches), then TTFT_N chats that share it
#    with a new question, one at a time, each gateway in turn per request; TTFT is the time to
#    the first byte of content, read by a Python client (the same for every mode). The
#    difference grpc - http is what gRPC mode adds; http-tok - http is the tokenizer's share.
#
#   scripts/bench-grpc.sh [ROUNDS] [TTFT_N]      (defaults 5 and 60; PROFILE=debug to try the
#                                                 script on a debug build, not for figures)
#
# Needs Qwen3's tokenizer (scripts/fetch-tokenizers.sh) and curl, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}" ttft_n="${2:-60}"
streams=64 tokens=256
tokenizer="${KVGATE_TOKENIZER_FIXTURES:-target/tokenizers}/qwen3"
[ -s "$tokenizer/tokenizer.json" ] || scripts/fetch-tokenizers.sh
source scripts/lib/fleet.sh
# Loading a model's tokenizer takes seconds on a loaded machine.
export FLEET_WAIT_S="${FLEET_WAIT_S:-60}"
profile="${PROFILE:-release}"
fleet_build "$profile"
bin="target/$profile"
fleet_init "$bin"
read -r http_sim grpc_sim http_port http_metrics tok_port tok_metrics grpc_port grpc_metrics \
  <<<"$(fleet_ports 2 2 1 1 1 1 1 1)"
sim=(--engines 2 --speedup 1 --decode-constant-ms 20 --decode-linear-ms 0 --decode-quadratic-ms 0
  --decode-min-ms 20 --prefill-constant-ms 1 --prefill-linear-ms 0 --prefill-quadratic-ms 0)
fleet_start sim-http "$bin/sim-engine" --base-port "$http_sim" "${sim[@]}"
fleet_start sim-grpc "$bin/sim-engine" --base-port "$grpc_sim" "${sim[@]}" --grpc sglang \
  --tokenizer-path "$tokenizer"
fleet_wait_port sim-http "$http_sim"
fleet_wait_port sim-http $((http_sim + 1))
http_workers="http://127.0.0.1:$http_sim http://127.0.0.1:$((http_sim + 1))"
fleet_start_kvgate "$bin" "$http_port" "$http_metrics" "$http_workers"
http_pid=$KVGATE_PID
fleet_start_kvgate "$bin" "$tok_port" "$tok_metrics" "$http_workers" --tokenizer-path "$tokenizer"
tok_pid=$KVGATE_PID
fleet_start_kvgate "$bin" "$grpc_port" "$grpc_metrics" \
  "grpc://127.0.0.1:$grpc_sim grpc://127.0.0.1:$((grpc_sim + 1))" --tokenizer-path "$tokenizer"
grpc_pid=$KVGATE_PID
for port in "$http_port" "$tok_port" "$grpc_port"; do fleet_wait_port kvgate "$port"; done

chat() { # SYSTEM USER MAX_TOKENS: a streamed chat body
  printf '{"model":"sim-model","max_tokens":%s,"stream":true,"messages":[{"role":"system","content":"%s"},{"role":"user","content":"%s"}]}' \
    "$3" "$1" "$2"
}
# The gRPC workers are up once a chat through their gateway answers 200.
for _ in $(seq 100); do
  curl -sf -o /dev/null "http://127.0.0.1:$grpc_port/v1/chat/completions" \
    -H 'content-type: application/json' -d "$(chat "warm" "up" 1)" && break
  sleep 0.2
done

# 64 concurrent streams through the gateway on PORT; prints its PID's CPU us for the batch, or
# fails when a stream did not end with [DONE].
batch_cpu_us() {
  local port="$1" pid="$2" round="$3" before after i done
  before=$(fleet_cpu_us "$pid")
  for i in $(seq 1 "$streams"); do
    curl -sfN "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
      -d "$(chat "You are a helpful assistant." "round $round stream $i: tell me a long story" "$tokens")" \
      >"$FLEET_WORK/stream-$i" &
  done
  wait
  after=$(fleet_cpu_us "$pid")
  done=$(cat "$FLEET_WORK"/stream-* | grep -c '^data: \[DONE\]' || true)
  [ "$done" = "$streams" ] || { echo "Error: $done of $streams streams on port $port ended with [DONE]" >&2; return 1; }
  echo $((after - before))
}

names=(http http-tok grpc) ports=("$http_port" "$tok_port" "$grpc_port") pids=("$http_pid" "$tok_pid" "$grpc_pid")
declare -A per_token per_request
echo "1. $streams concurrent streams of $tokens output tokens, gateway CPU (us)"
for round in $(seq 1 "$rounds"); do
  line="round $round:"
  for k in 0 1 2; do
    m=$(( (k + round) % 3 ))
    cpu=$(batch_cpu_us "${ports[$m]}" "${pids[$m]}" "$round")
    per_token[${names[$m]}]+="$(fleet_stats --decimals 3 ratio "$cpu" $((streams * tokens))) "
    per_request[${names[$m]}]+="$(fleet_stats --decimals 1 ratio "$cpu" "$streams") "
    line+=" ${names[$m]} $(fleet_stats --decimals 3 ratio "$cpu" $((streams * tokens)))/token"
  done
  echo "$line"
done
for name in "${names[@]}"; do
  # shellcheck disable=SC2086 # lists of numbers
  echo "median $name: $(fleet_stats --decimals 3 median ${per_token[$name]}) us per output token, $(fleet_stats --decimals 1 median ${per_request[$name]}) us per request"
done

echo "2. TTFT of a ~2k-token chat with its head cached, ms (first content byte, $ttft_n per gateway)"
system=$(for i in $(seq 1 150); do printf 'The gateway routes request %s to the engine that holds its prefix. ' "$i"; done)
python3 - "$ttft_n" "$system" "$http_port" "$tok_port" "$grpc_port" <<'EOF'
import http.client, json, statistics, sys, time

n, system, ports = int(sys.argv[1]), sys.argv[2], [int(p) for p in sys.argv[3:]]
names = ["http", "http-tok", "grpc"]

def ttft(port, question):
    body = json.dumps({"model": "sim-model", "max_tokens": 2, "stream": True, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": question}]})
    conn = http.client.HTTPConnection("127.0.0.1", port)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200, (port, response.status, response.read())
    first = None
    for line in response:
        if first is None and line.startswith(b"data: {"):
            delta = json.loads(line[6:])["choices"][0].get("delta", {})
            if delta.get("content"):
                first = time.perf_counter() - start
    conn.close()
    assert first is not None, port
    return first * 1e3

for port in ports:  # the head into every cache
    ttft(port, "warm up")
times = {name: [] for name in names}
for i in range(n):
    for k in range(3):
        m = (k + i) % 3
        times[names[m]].append(ttft(ports[m], f"question {i}: what is cached?"))
median = {name: statistics.median(t) for name, t in times.items()}
for name in names:
    t = sorted(times[name])
    print(f"{name}: median {median[name]:.3f} ms, p90 {t[int(0.9 * (len(t) - 1))]:.3f} ms")
print(f"grpc - http: {median['grpc'] - median['http']:+.3f} ms; http-tok - http (the tokenizer): "
      f"{median['http-tok'] - median['http']:+.3f} ms")
EOF
