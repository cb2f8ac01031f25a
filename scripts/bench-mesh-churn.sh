#!/usr/bin/env bash
# The mesh under churn (issue 37): how long until a gateway routes what the others learned, after
#   late-join   it joins a mesh of 3 that already learned FAMILIES prefixes (through one peer);
#   restart     it was killed (SIGKILL) and starts again on the same address;
#   pause       it was paused (SIGSTOP) for PAUSE_S seconds while a peer learned FAMILIES new
#               prefixes, and resumes: a partition of one gateway from all the others that
#               heals (made with signals, not the host's firewall, which other users share).
# Two times from the event: until the gateway and its peers see each other alive (SWIM), and
# until it caught up: applied as many peer inserts as were taught and runs no repair. A
# gateway's catch-up starts with the first delta it hears from a peer, so as soon as the
# membership settled one new prefix is sent to the first gateway, as traffic would. The script
# then checks that the gateway routes every taught prefix to the worker its teacher did
# (`x-smg-routed-worker-id`; probing earlier would teach it wrong answers) and prints how many
# did. One line per event in OUT_DIR/churn.txt.
#
#   scripts/bench-mesh-churn.sh [OUT_DIR]   (default target/bench-mesh-churn; BIN=DIR the
#                                            binaries, default target/release; SKIP_BUILD=1)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/fleet.sh
source scripts/lib/fleet.sh
out="${1:-target/bench-mesh-churn}"
mkdir -p "$out"
[ -n "${SKIP_BUILD:-}" ] || cargo build --release -p kvgate --bin kvgate -p bench-harness \
  --bin sim-engine --bin fleet
bin="${BIN:-target/release}"
families="${FAMILIES:-32}"
pause_s="${PAUSE_S:-10}"
fleet_init "$bin" "$out/logs"

read -r sim_base mesh_base gw_base metrics_base < <(fleet_ports 4 4 4 4)
fleet_start_sim "$bin" "$sim_base" --engines 4 --instant
workers=()
for i in 0 1 2 3; do workers+=("http://127.0.0.1:$((sim_base + i))"); done
fleet_wait sim-engine "${workers[@]/%//health}"

gw_pids=()
start_gw() { # I PEER_INDEX...: gateway I, announced to the peers' mesh ports
  local i="$1" peers=()
  shift
  local p
  for p in "$@"; do peers+=("127.0.0.1:$((mesh_base + p))"); done
  local args=(--host 127.0.0.1 --port $((gw_base + i)) --prometheus-host 127.0.0.1
    --prometheus-port $((metrics_base + i)) --data-cores 1 --log-level warn
    --worker-urls "${workers[@]}" --enable-mesh --mesh-host 127.0.0.1
    --mesh-port $((mesh_base + i)) --mesh-secret-file "$out/mesh.key")
  [ ${#peers[@]} -eq 0 ] || args+=(--mesh-peer-urls "${peers[@]}")
  FLEET_LOG_APPEND=1 fleet_start "kvgate-$i" "$bin/kvgate" "${args[@]}"
  gw_pids[i]=$FLEET_PID
  fleet_wait_port "kvgate-$i" $((gw_base + i))
}
metric() { # I SERIES
  curl -s "http://127.0.0.1:$((metrics_base + $1))/metrics" |
    awk -v s="$2" '$1 == s { print $2; found = 1 } END { if (!found) print 0 }'
}
body() { # FAMILY: a /generate body of 128 token ids that are the family's own
  python3 -c 'import json, sys; f = int(sys.argv[1]); print(json.dumps({"model": "sim-model",
"input_ids": [f * 1000 + i for i in range(128)], "sampling_params": {"max_new_tokens": 1}}))' "$1"
}
route() { # I FAMILY: the worker gateway I sends the family to
  curl -s -o /dev/null -D - -H 'content-type: application/json' --data "$(body "$2")" \
    "http://127.0.0.1:$((gw_base + $1))/generate" |
    awk -F': ' 'tolower($1) == "x-smg-routed-worker-id" { gsub(/\r/, "", $2); print $2 }'
}
declare -A taught=()
teach() { # I FIRST COUNT: families FIRST.. sent to gateway I; their workers kept in `taught`
  local f
  for ((f = $2; f < $2 + $3; f++)); do taught[$f]=$(route "$1" "$f"); done
}
matched() { # I FIRST COUNT: how many of those families gateway I routes as they were taught
  local f n=0
  for ((f = $2; f < $2 + $3; f++)); do [ "$(route "$1" "$f")" = "${taught[$f]}" ] && n=$((n + 1)); done
  echo "$n"
}
now() { date +%s.%N; }
repairs() { # I: that gateway's repairs, "started/retried"
  echo "$(metric "$1" 'kvgate_mesh_repairs_total{outcome="started"}')/$(metric "$1" 'kvgate_mesh_repairs_total{outcome="retried"}')"
}
since() { python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.2f}")' "$1" "$(now)"; }
converged() { # I PEERS INSERTS: I sees PEERS alive, applied >= INSERTS, no repair running
  local started done abandoned
  started=$(metric "$1" 'kvgate_mesh_repairs_total{outcome="started"}')
  done=$(metric "$1" 'kvgate_mesh_repairs_total{outcome="completed"}')
  abandoned=$(metric "$1" 'kvgate_mesh_repairs_total{outcome="abandoned"}')
  [ "$(metric "$1" 'kvgate_mesh_peers{state="alive"}')" = "$2" ] &&
    python3 -c 'import sys; a, n, s, d, x = map(float, sys.argv[1:]); sys.exit(not (a >= n and s == d + x))' \
      "$(metric "$1" kvgate_mesh_inserts_applied_total)" "$3" "$started" "$done" "$abandoned"
}
wait_for() { # LIMIT_S COMMAND...: polls every 50 ms; fails after LIMIT_S
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    if [ $SECONDS -ge $deadline ]; then
      echo "timed out: $*" >&2
      [ "$1" != converged ] || curl -s "http://127.0.0.1:$((metrics_base + $2))/metrics" |
        grep '^kvgate_mesh' >&2
      return 1
    fi
    sleep 0.05
  done
}
trigger=100000
trigger() { # one new family to gateway 0, as traffic would send
  route 0 $trigger >/dev/null
  trigger=$((trigger + 1))
}
all_alive() { # sees every other gateway of N alive, at each of the given gateways
  local n="$1" i
  shift
  for i in "$@"; do [ "$(metric "$i" 'kvgate_mesh_peers{state="alive"}')" = $((n - 1)) ] || return 1; done
}

head -c 32 /dev/urandom >"$out/mesh.key"
chmod 600 "$out/mesh.key"
: >"$out/churn.txt"
start_gw 0
start_gw 1 0
start_gw 2 0
wait_for 30 all_alive 3 0 1 2
teach 0 0 "$families"
for i in 1 2; do wait_for 30 converged "$i" 2 "$families"; done

# Late join: gateway 3 announces itself to gateway 1 only.
t0=$(now)
start_gw 3 1
wait_for 60 all_alive 4 0 1 2 3
members=$(since "$t0")
trigger
wait_for 60 converged 3 3 "$families"
took=$(since "$t0")
echo "late-join  members ${members} s, caught up ${took} s (repairs started/retried $(repairs 3))  routes matched $(matched 3 0 "$families")/$families" |
  tee -a "$out/churn.txt"

# Kill gateway 2; restart it on the same address.
kill -9 "${gw_pids[2]}"
t0=$(now)
wait_for 60 all_alive 3 0 1 3
down=$(since "$t0")
t0=$(now)
start_gw 2 0
wait_for 60 all_alive 4 0 1 2 3
members=$(since "$t0")
trigger
wait_for 60 converged 2 3 "$families"
took=$(since "$t0")
echo "restart    declared down ${down} s; after the start: members ${members} s, caught up ${took} s (repairs started/retried $(repairs 2))  routes matched $(matched 2 0 "$families")/$families" |
  tee -a "$out/churn.txt"

# Pause gateway 1 while gateway 0 learns new families; resume.
before=$(metric 1 kvgate_mesh_inserts_applied_total)
kill -STOP "${gw_pids[1]}"
wait_for 60 all_alive 3 0 2 3
teach 0 1000 "$families"
sleep "$pause_s"
kill -CONT "${gw_pids[1]}"
t0=$(now)
wait_for 60 all_alive 4 0 1 2 3
members=$(since "$t0")
trigger
want=$(python3 -c 'import sys; print(float(sys.argv[1]) + int(sys.argv[2]))' "$before" "$families")
wait_for 60 converged 1 3 "$want"
took=$(since "$t0")
echo "pause      ${pause_s} s; after resuming: members ${members} s, caught up ${took} s (repairs started/retried $(repairs 1))  routes matched $(matched 1 1000 "$families")/$families" |
  tee -a "$out/churn.txt"
