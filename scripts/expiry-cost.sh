#!/usr/bin/env bash
# What active expiry costs: A B A B runs of the headline workload against one kvd, A with plain
# puts, B with every key and every update carrying a random time to live (so keys expire all
# the time and the active cycle works), CPU-pinned, one line per run.
set -euo pipefail
if [ "${1:-}" = "--help" ]; then
  cat <<'TXT'
Usage: scripts/expiry-cost.sh [KVD [KVBENCH]]      (default: target/release/kvd, kvbench)

Per run: starts kvd on 127.0.0.1:PORT (default 27401; RESP on PORT+1) pinned to CPU 0, loads
RECORDS (1000000) records of 128 B (B: kvbench load --ttl TTL, default 5s..60s), runs YCSB B
(95% get / 5% update, zipfian 0.99) for DURATION (20s) pinned to CPU 1 (B: run --ttl TTL),
and prints ops/s, read p99 (us), and from kvd's INFO: expired keys, the active cycle's
CPU time and its share of the run (expire_cycle_cpu_milliseconds / run time). Stops the
kvd it started, by PID. ROUNDS (2) rounds of A then B.
TXT
  exit 2
fi
KVD=${1:-target/release/kvd} KVBENCH=${2:-target/release/kvbench}
PORT=${PORT:-27401} RECORDS=${RECORDS:-1000000} DURATION=${DURATION:-20s} TTL=${TTL:-5s..60s}
out=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null || true; rm -rf "$out"' EXIT
info() { redis-cli -p "$((PORT + 1))" info stats | tr -d '\r' | grep "^$1:" | cut -d: -f2; }
run() { # label, then extra kvbench flags
  local label=$1; shift
  taskset -c 0 "$KVD" --listen "127.0.0.1:$PORT" --resp "127.0.0.1:$((PORT + 1))" --capacity "$RECORDS" >/dev/null 2>&1 &
  pid=$!
  sleep 0.5
  taskset -c 1 "$KVBENCH" load --nodes "127.0.0.1:$PORT" --records "$RECORDS" -q "$@" >/dev/null
  local e0 c0 t0
  e0=$(info expired_keys) c0=$(info expire_cycle_cpu_milliseconds) t0=$(date +%s%N)
  taskset -c 1 "$KVBENCH" run --nodes "127.0.0.1:$PORT" --records "$RECORDS" -w b -d "$DURATION" --warmup 2s \
    -q --json "$out/run.json" "$@" >/dev/null
  local e1 c1 t1
  e1=$(info expired_keys) c1=$(info expire_cycle_cpu_milliseconds) t1=$(date +%s%N)
  python3 - "$out/run.json" "$label" "$((e1 - e0))" "$((c1 - c0))" "$(((t1 - t0) / 1000000))" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
label, expired, cycle_ms, wall_ms = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
p99 = r["latency_us"].get("read", {}).get("p99_us", float("nan"))
print(f"{label}: {r['ops_per_sec'] / 1e6:.2f}M op/s, read p99 {p99} us, expired {expired}, "
      f"cycle {cycle_ms} ms = {100 * cycle_ms / wall_ms:.2f}% of a core")
PY
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
}
for _ in $(seq 1 "${ROUNDS:-2}"); do
  run "A plain"
  run "B ttl $TTL" --ttl "$TTL"
done
