#!/usr/bin/env bash
# Hostile clients: a normal client measures p50/p99 latency of small completions through kvgate
# alone (quiet), then while 10,000 idle connections and 1,000 slow-header (slowloris) clients
# are held open (target: p99 within 2x of quiet). bench-harness's `slowloris` does both phases;
# kvgate runs with one data core in front of a two-engine sim-engine (scripts/lib/fleet.sh).
#
#   scripts/bench-hostile.sh [--idle 10000] [--slow 1000] [--measure-s 30] [--debug]
#                            [--slow-body N] [--kvgate PATH] [-- KVGATE_FLAGS...]
#
# --slow-body N adds N connections that announce a 1 MiB body and send one byte of it every 10 s
# (issue 35); the JSON then has the measuring client's answered share and kvgate's RSS quiet,
# under attack and after the hostile connections close. --kvgate runs another kvgate binary (a
# build of an older commit, for a before/after); flags after `--` go to kvgate.
#   scripts/bench-hostile.sh --kv-frames [--debug]
#
# --kv-frames runs instead a hostile KV-event publisher: a ZMTP peer written by hand (python3)
# that answers kvgate's subscription with a frame header announcing 2^62 bytes, then a 200 MB
# frame sent whole, then 2^64-1; prints whether kvgate is alive, its RSS and the subscription
# failures it counted.
#   scripts/bench-hostile.sh --big-prompts [--debug] [--kvgate PATH]
#
# --big-prompts sends 16 distinct 60 MB completions prompts, one after another (issue 35, item
# 5), then leaves kvgate idle 10 s; prints its RSS before, at the peak and after.
#   scripts/bench-hostile.sh --many-messages [--debug] [--kvgate PATH]
#
# --many-messages runs kvgate with Qwen3's tokenizer (scripts/fetch-tokenizers.sh) and one data
# core; a client sends small chats back to back on one connection while another sends a chat of
# 400k messages (12 MB: past the byte cap) and then one of 400k empty messages (1.2 MB: past the
# message cap) (issue 35, item 7); prints the small chats' worst latency while each was in
# flight, and the tokenization counters.
#
# Raises the open-file limit to the hard limit (kvgate and the client each hold one descriptor
# per connection); writes target/bench-hostile/result.json.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/fleet.sh
source scripts/lib/fleet.sh

IDLE=10000
SLOW=1000
SLOW_BODY=0
KVGATE=""
KVGATE_FLAGS=()
MEASURE_S=30
PROFILE=release
KV_FRAMES=0
MODE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --kv-frames) KV_FRAMES=1; shift ;;
    --big-prompts) MODE=big-prompts; shift ;;
    --many-messages) MODE=many-messages; shift ;;
    --idle) IDLE="$2"; shift 2 ;;
    --slow) SLOW="$2"; shift 2 ;;
    --measure-s) MEASURE_S="$2"; shift 2 ;;
    --debug) PROFILE=debug; shift ;;
    --slow-body) SLOW_BODY="$2"; shift 2 ;;
    --kvgate) KVGATE="$2"; shift 2 ;;
    --) shift; KVGATE_FLAGS=("$@"); break ;;
    *) echo "Error: unknown flag $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
fleet_build "$PROFILE"
BIN="${KVGATE_BIN_DIR:-target/$PROFILE}"

# A hostile KV-event publisher on port $1: each of three connections gets a greeting and a READY,
# then a frame header announcing 2^62 bytes, a 200 MB frame with its body, 2^64-1 bytes.
kv_frames_publisher() {
  exec python3 - "$1" <<'PY'
import socket, struct, sys, time
port = int(sys.argv[1])
cases = [(1 << 62, False), (200_000_000, True), ((1 << 64) - 1, False)]
ready = b"\x05READY\x0bSocket-Type" + struct.pack(">I", 3) + b"PUB"
greeting = (b"\xff" + b"\0" * 8 + b"\x7f\x03\x00" + b"NULL").ljust(64, b"\0")
server = socket.create_server(("127.0.0.1", port))
for announced, body in cases:
    conn, _ = server.accept()
    conn.sendall(greeting + bytes([0x04, len(ready)]) + ready)
    time.sleep(0.3)
    try:
        conn.sendall(b"\x02" + struct.pack(">Q", announced))
        if body:
            chunk = b"\x07" * (1 << 20)
            for _ in range(announced // len(chunk)):
                conn.sendall(chunk)
    except OSError:
        pass
    print(f"sent a frame of {announced} bytes{' with its body' if body else ''}", flush=True)
    conn.close()
PY
}

# Big prompts against 127.0.0.1:$1: 16 distinct 60 MB completions prompts, one per connection.
big_prompts_client() {
  python3 - "$1" <<'PY'
import http.client, sys
port = int(sys.argv[1])
for i in range(16):
    prompt = (f"prompt {i} " + "lorem ipsum dolor sit amet " * 2_300_000)[:60_000_000]
    body = ('{"model":"sim-model","max_tokens":1,"prompt":"%s"}' % prompt).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", body, {"content-type": "application/json"})
    status = conn.getresponse().status
    conn.close()
    print(f"prompt {i}: {len(body)} bytes, {status}", flush=True)
PY
}

# Small chats on one connection to 127.0.0.1:$1 while the 400k-message chats go on another.
many_messages_client() {
  python3 - "$1" <<'PY'
import http.client, json, sys, threading, time
port = int(sys.argv[1])
small = json.dumps({"model": "sim-model", "max_tokens": 1,
                    "messages": [{"role": "user", "content": "a small question"}]}).encode()
def chat(messages):
    first = '{"role":"user","content":"x"}'
    return ('{"model":"sim-model","max_tokens":1,"messages":[%s]}'
            % ",".join([first] + [messages] * 399_999)).encode()
attacks = [("400k messages, 12 MB", chat('{"role":"user","content":"x"}')),
           ("400k empty messages, 1.2 MB", chat("{}"))]
window = {"label": None}
worst = {}
done = threading.Event()
def other():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    while not done.is_set():
        label, sent = window["label"], time.monotonic()
        conn.request("POST", "/v1/chat/completions", small, {"content-type": "application/json"})
        conn.getresponse().read()
        latency = time.monotonic() - sent
        key = label or window["label"] or "quiet"
        worst[key] = max(worst.get(key, 0.0), latency)
thread = threading.Thread(target=other)
thread.start()
time.sleep(3)
for label, body in attacks:
    window["label"] = label
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    sent = time.monotonic()
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    status = conn.getresponse().status
    print(f"{label}: {status} in {time.monotonic() - sent:.2f} s", flush=True)
    conn.close()
    window["label"] = None
    time.sleep(2)
done.set()
thread.join()
for key, value in worst.items():
    print(f"another client's worst latency, {key}: {value * 1000:.0f} ms", flush=True)
PY
}

if [ -n "$MODE" ]; then
  fleet_init "$BIN"
  read -r SIM_PORT GW_PORT PROM_PORT < <(fleet_ports 2 1 1)
  fleet_start_sim "$BIN" "$SIM_PORT" --engines 2 --speedup 50
  fleet_wait_port sim-engine "$SIM_PORT"
  KVGATE_DIR="$BIN"
  if [ -n "$KVGATE" ]; then
    KVGATE_DIR="$FLEET_WORK/kvgate-bin"
    mkdir -p "$KVGATE_DIR"
    ln -s "$(realpath "$KVGATE")" "$KVGATE_DIR/kvgate"
  fi
  WORKERS="http://127.0.0.1:$SIM_PORT http://127.0.0.1:$((SIM_PORT + 1))"
  if [ "$MODE" = many-messages ]; then
    TOKENIZER="${KVGATE_TOKENIZER_FIXTURES:-target/tokenizers}/qwen3"
    [ -s "$TOKENIZER/tokenizer.json" ] || { echo "Error: run scripts/fetch-tokenizers.sh" >&2; exit 1; }
    KVGATE_FLAGS+=(--tokenizer-path "$TOKENIZER")
  fi
  fleet_start_kvgate "$KVGATE_DIR" "$GW_PORT" "$PROM_PORT" "$WORKERS" "${KVGATE_FLAGS[@]}"
  FLEET_WAIT_S="${FLEET_WAIT_S:-120}" fleet_wait kvgate "http://127.0.0.1:$GW_PORT/health" # a tokenizer loads first
  sleep 5
  echo "kvgate RSS at start: $(fleet_rss_kb "$KVGATE_PID") kB" >&2
  if [ "$MODE" = big-prompts ]; then
    big_prompts_client "$GW_PORT" >&2
    echo "kvgate RSS after the 16 prompts: $(fleet_rss_kb "$KVGATE_PID") kB, peak $(fleet_rss_kb --peak "$KVGATE_PID") kB" >&2
    sleep 10
    echo "kvgate RSS after 10 s idle: $(fleet_rss_kb "$KVGATE_PID") kB" >&2
  else
    many_messages_client "$GW_PORT" >&2
    curl -s "http://127.0.0.1:$PROM_PORT/metrics" | grep -E '^kvgate_tokenize_' >&2 || true
  fi
  exit 0
fi

if [ "$KV_FRAMES" = 1 ]; then
  fleet_init "$BIN"
  read -r SIM_PORT GW_PORT PROM_PORT ZMQ_PORT < <(fleet_ports 1 1 1 1)
  fleet_start_sim "$BIN" "$SIM_PORT" --engines 1 --speedup 50
  fleet_wait_port sim-engine "$SIM_PORT"
  kv_frames_publisher "$ZMQ_PORT" >&2 &
  FLEET_PIDS+=("$!")
  fleet_start_kvgate "$BIN" "$GW_PORT" "$PROM_PORT" "http://127.0.0.1:$SIM_PORT" \
    --kv-events-endpoints "tcp://127.0.0.1:$ZMQ_PORT"
  fleet_wait_port kvgate "$GW_PORT"
  echo "kvgate RSS at start: $(fleet_rss_kb "$KVGATE_PID") kB" >&2
  sleep 20
  if kill -0 "$KVGATE_PID" 2>/dev/null; then
    echo "kvgate alive; RSS $(fleet_rss_kb "$KVGATE_PID") kB, peak $(fleet_rss_kb --peak "$KVGATE_PID") kB" >&2
    curl -s "http://127.0.0.1:$PROM_PORT/metrics" | grep -E '^kvgate_kv_events_stream_up|reason="too_large"' >&2 || true
  else
    echo "kvgate died: $(tail -3 "$FLEET_WORK/kvgate.log")" >&2
  fi
  exit 0
fi
ulimit -n "$(ulimit -Hn)"
NEED=$((IDLE + SLOW + SLOW_BODY + 1000))
if [ "$(ulimit -n)" -lt "$NEED" ]; then
  echo "Error: the open-file limit is $(ulimit -n), below the $NEED this run needs (raise the hard limit)" >&2
  exit 1
fi
echo "open-file limit $(ulimit -n)" >&2

fleet_init "$BIN"
read -r SIM_PORT GW_PORT < <(fleet_ports 2 2)
SIM_PORT2=$((SIM_PORT + 1))
PROM_PORT=$((GW_PORT + 1))
fleet_start_sim "$BIN" "$SIM_PORT" --engines 2 --speedup 50
fleet_wait_port sim-engine "$SIM_PORT"
fleet_wait_port sim-engine "$SIM_PORT2"
KVGATE_DIR="$BIN"
if [ -n "$KVGATE" ]; then
  KVGATE_DIR="$FLEET_WORK/kvgate-bin"
  mkdir -p "$KVGATE_DIR"
  ln -s "$(realpath "$KVGATE")" "$KVGATE_DIR/kvgate"
fi
fleet_start_kvgate "$KVGATE_DIR" "$GW_PORT" "$PROM_PORT" \
  "http://127.0.0.1:$SIM_PORT http://127.0.0.1:$SIM_PORT2" "${KVGATE_FLAGS[@]}"
fleet_wait_port kvgate "$GW_PORT"
sleep 2

mkdir -p target/bench-hostile
"$BIN/slowloris" --target "127.0.0.1:$GW_PORT" --idle "$IDLE" --slow "$SLOW" \
  --slow-body "$SLOW_BODY" --pid "$KVGATE_PID" \
  --measure-s "$MEASURE_S" --out target/bench-hostile/result.json
echo "kvgate RSS after the run: $(fleet_rss_kb "$KVGATE_PID") kB" >&2
echo "panics in the kvgate log: $(grep -c panicked "$FLEET_WORK/kvgate.log" || true)" >&2
