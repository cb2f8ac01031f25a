# Sourced (from the repository root) by scripts that run kvgate in front of a simulated fleet
# (flamegraph.sh). Every process goes to the background with its log in $FLEET_WORK and its pid
# in FLEET_PIDS; the EXIT trap that fleet_init sets kills them all and removes $FLEET_WORK.
#
#   fleet_build PROFILE                         builds kvgate and bench-harness's binaries
#                                               (release or debug) into target/PROFILE
#   fleet_init                                  FLEET_WORK (a new temporary folder), the trap
#   fleet_start_sim BIN_DIR PORT ARGS...        sim-engine, engine 0 on PORT (--engines N: more)
#   fleet_start_kvgate BIN_DIR PORT METRICS_PORT WORKERS ARGS...
#                                               kvgate on 127.0.0.1:PORT with one data core;
#                                               WORKERS: space-separated URLs; its pid in
#                                               KVGATE_PID
#   fleet_wait_port NAME PORT                   waits up to 20 s for a listener on PORT, else
#                                               fails with the tail of NAME's log

fleet_build() {
  if [ "$1" = release ]; then
    cargo build --release -p kvgate -p bench-harness --bins >&2
  else
    cargo build -p kvgate -p bench-harness --bins >&2
  fi
}

fleet_init() {
  FLEET_WORK="$(mktemp -d)"
  FLEET_PIDS=()
  trap fleet_stop EXIT
}

fleet_stop() {
  local pid
  for pid in "${FLEET_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${FLEET_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$FLEET_WORK"
}

fleet_start_sim() {
  local bin_dir="$1" port="$2"
  shift 2
  "$bin_dir/sim-engine" --base-port "$port" "$@" >"$FLEET_WORK/sim-engine.log" 2>&1 &
  FLEET_PIDS+=($!)
}

fleet_start_kvgate() {
  local bin_dir="$1" port="$2" metrics_port="$3" workers="$4"
  shift 4
  # shellcheck disable=SC2086 # WORKERS is a list of URLs
  "$bin_dir/kvgate" --host 127.0.0.1 --port "$port" --prometheus-host 127.0.0.1 \
    --prometheus-port "$metrics_port" --data-cores 1 --log-level warn \
    --worker-urls $workers "$@" >"$FLEET_WORK/kvgate.log" 2>&1 &
  KVGATE_PID=$!
  FLEET_PIDS+=("$KVGATE_PID")
}

fleet_wait_port() {
  local name="$1" port="$2"
  for _ in $(seq 200); do
    (echo >/dev/tcp/127.0.0.1/"$port") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "Error: $name is not listening on port $port after 20 s; its log:" >&2
  tail -n 20 "$FLEET_WORK/$name.log" >&2 || true
  return 1
}
