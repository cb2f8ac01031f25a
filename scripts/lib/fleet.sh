# Sourced (from the repository root) by every script that starts sim-engine, kvgate or a proxy
# beside them. Every process goes to the background with its log in $FLEET_WORK and its pid in
# FLEET_PIDS; the EXIT trap that fleet_init sets kills them all. Ports, waits, CPU time and
# statistics come from bench-harness's `fleet` binary (bench_harness::fleet and ::stats, which
# `replay compare`, `chaos` and the tests use too), so no script finds ports, polls or computes
# medians of its own.
#
#   fleet_build PROFILE                 builds kvgate and bench-harness's binaries (release or
#                                       debug) into target/PROFILE
#   fleet_init BIN_DIR [LOG_DIR]        FLEET_WORK (LOG_DIR, kept; else a new temporary folder,
#                                       removed at exit), the trap; `fleet` is taken from BIN_DIR
#                                       (FLEET_TOOL overrides)
#   fleet_ports N...                    the first port of each block of N free ports (below the
#                                       ephemeral range; the blocks do not overlap)
#   fleet_start NAME COMMAND...         COMMAND in the background, its output in $FLEET_WORK/NAME.log
#                                       (appended with FLEET_LOG_APPEND=1); its pid in FLEET_PID
#   fleet_start_sim BIN PORT ARGS...    sim-engine, engine 0 on PORT (--engines N: more); SIM_PID
#   fleet_start_kvgate BIN PORT METRICS_PORT WORKERS ARGS...
#                                       kvgate on 127.0.0.1:PORT with one data core (or
#                                       FLEET_DATA_CORES), log level warn; WORKERS:
#                                       space-separated URLs; its pid in KVGATE_PID
#                                       (BIN: the folder that holds the binary, or the binary)
#   fleet_start_nginx NGINX PORT UPSTREAM_PORT WORKERS CONNECTIONS [MAIN_DIRECTIVES]
#                                       nginx on 127.0.0.1:PORT in front of UPSTREAM_PORT with
#                                       upstream keepalive (the proxy the benchmarks compare kvgate
#                                       with), WORKERS workers of CONNECTIONS each; NGINX_PID.
#                                       FLEET_NGINX_TLS="PORT CERT KEY": also HTTPS on PORT
#                                       (TLS 1.3, ssl_session_cache)
#   FLEET_PIN=CPUS fleet_start...       the process pinned to CPUS (taskset -c)
#   fleet_wait NAME URL...              waits up to 20 s (FLEET_WAIT_S) until each URL answers
#                                       GET with 200, else fails with the tail of NAME's log
#   fleet_wait_port NAME PORT           fleet_wait NAME http://127.0.0.1:PORT/health
#   fleet_kill_all                      kills and reaps every process started so far
#   fleet_cpu_us [--thread NAME]... PID...
#                                       CPU microseconds (user + system) the processes (their
#                                       threads of those names) have used so far
#   fleet_host_cpu CPU...               "busy total steal" clock ticks of each CPU
#   fleet_rss_kb [--peak] PID           resident memory (VmRSS; its peak, VmHWM) in KiB
#   fleet_stats [--decimals N] median|mean|min|max|sum X... / ratio A B / share PART WHOLE
#   fleet_round N X                     X with N decimals (as printf's %.Nf rounds a double)

fleet_build() {
  if [ "$1" = release ]; then
    cargo build --release -p kvgate -p bench-harness --bins >&2
  else
    cargo build -p kvgate -p bench-harness --bins >&2
  fi
}

fleet_init() {
  FLEET_TOOL="${FLEET_TOOL:-$1/fleet}"
  [ -x "$FLEET_TOOL" ] || { echo "Error: $FLEET_TOOL is missing: build bench-harness's binaries" >&2; return 2; }
  if [ -n "${2:-}" ]; then
    FLEET_WORK="$2"; FLEET_WORK_KEPT=1
    mkdir -p "$FLEET_WORK"
  else
    FLEET_WORK="$(mktemp -d)"; FLEET_WORK_KEPT=0
  fi
  FLEET_PIDS=()
  trap fleet_stop EXIT
}

fleet_kill_all() {
  local pid
  for pid in "${FLEET_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${FLEET_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  FLEET_PIDS=()
}

fleet_stop() {
  fleet_kill_all
  [ "$FLEET_WORK_KEPT" = 1 ] || rm -rf "$FLEET_WORK"
}

fleet_ports() { "$FLEET_TOOL" ports "$@"; }
fleet_cpu_us() { "$FLEET_TOOL" cpu "$@"; }
fleet_host_cpu() { "$FLEET_TOOL" host-cpu "$@"; }
fleet_rss_kb() { "$FLEET_TOOL" rss "$@"; }
fleet_stats() { "$FLEET_TOOL" stats "$@"; }
fleet_round() { "$FLEET_TOOL" stats --decimals "$1" sum "$2"; }

fleet_start() {
  local name="$1" pin=()
  shift
  [ -n "${FLEET_PIN:-}" ] && pin=(taskset -c "$FLEET_PIN")
  if [ "${FLEET_LOG_APPEND:-0}" = 1 ]; then
    "${pin[@]}" "$@" >>"$FLEET_WORK/$name.log" 2>&1 &
  else
    "${pin[@]}" "$@" >"$FLEET_WORK/$name.log" 2>&1 &
  fi
  FLEET_PID=$!
  FLEET_PIDS+=("$FLEET_PID")
}

fleet_binary() { # BIN NAME -> BIN/NAME when BIN is a folder, else BIN
  if [ -d "$1" ]; then echo "$1/$2"; else echo "$1"; fi
}

fleet_start_sim() {
  local bin="$1" port="$2"
  shift 2
  fleet_start sim-engine "$(fleet_binary "$bin" sim-engine)" --base-port "$port" "$@"
  SIM_PID=$FLEET_PID
}

fleet_start_kvgate() {
  local bin="$1" port="$2" metrics_port="$3" workers="$4"
  shift 4
  # shellcheck disable=SC2086 # WORKERS is a list of URLs
  fleet_start kvgate "$(fleet_binary "$bin" kvgate)" --host 127.0.0.1 --port "$port" --prometheus-host 127.0.0.1 \
    --prometheus-port "$metrics_port" --data-cores "${FLEET_DATA_CORES:-1}" --log-level warn \
    --worker-urls $workers "$@"
  KVGATE_PID=$FLEET_PID
}

fleet_start_nginx() {
  local nginx="$1" port="$2" upstream="$3" workers="$4" connections="$5" main="${6:-}"
  local dir="$FLEET_WORK/nginx" tls=""
  mkdir -p "$dir/logs"
  if [ -n "${FLEET_NGINX_TLS:-}" ]; then
    local tls_port tls_cert tls_key
    read -r tls_port tls_cert tls_key <<<"$FLEET_NGINX_TLS"
    tls="listen 127.0.0.1:$tls_port ssl reuseport; ssl_certificate $tls_cert; ssl_certificate_key $tls_key;
    ssl_protocols TLSv1.3; ssl_session_cache shared:SSL:10m;"
  fi
  cat >"$dir/nginx.conf" <<EOF
worker_processes $workers;
$main
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections $connections; }
http {
  access_log off;
  client_body_temp_path $dir/body; proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fastcgi; uwsgi_temp_path $dir/uwsgi; scgi_temp_path $dir/scgi;
  keepalive_requests 1000000;
  client_body_buffer_size 128k;
  upstream sim { server 127.0.0.1:$upstream; keepalive 256; }
  server {
    listen 127.0.0.1:$port reuseport;
    $tls
    location / {
      proxy_pass http://sim;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
EOF
  fleet_start nginx "$nginx" -p "$dir" -c "$dir/nginx.conf" -g "daemon off;"
  NGINX_PID=$FLEET_PID
}

fleet_wait() {
  local name="$1"
  shift
  "$FLEET_TOOL" wait --timeout-s "${FLEET_WAIT_S:-20}" --log "$FLEET_WORK/$name.log" "$name" "$@"
}

fleet_wait_port() { fleet_wait "$1" "http://127.0.0.1:$2/health"; }
