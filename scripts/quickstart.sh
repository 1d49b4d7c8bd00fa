#!/usr/bin/env bash
# Start a local kvd cluster on loopback, load it, benchmark it with YCSB-B, print the result,
# and stop the nodes again (only the ones this script started, by PID).
#
#   scripts/quickstart.sh                 # 2 nodes, 1,000,000 records, 10 s of YCSB-B
#   NODES=1 DURATION=5s scripts/quickstart.sh --batch 8192
#
# Environment: NODES (2), BASE_PORT (7070), RECORDS (1000000), DURATION (10s).
# Extra arguments go to `kvbench run` (see `kvbench run --help`).
set -euo pipefail
cd "$(dirname "$0")/.."

NODES=${NODES:-2}
BASE_PORT=${BASE_PORT:-7070}
RECORDS=${RECORDS:-1000000}
DURATION=${DURATION:-10s}

echo "== building (release)"
cargo build --release --quiet -p kvd -p kvbench
KVD=target/release/kvd
KVBENCH=target/release/kvbench

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

addrs=()
for ((i = 0; i < NODES; i++)); do
  addr="127.0.0.1:$((BASE_PORT + i))"
  "$KVD" --shard "$i/$NODES" --listen "$addr" --capacity "$((RECORDS / NODES + 1))" 2>>"${TMPDIR:-/tmp}/kvd-quickstart-$i.log" &
  pids+=("$!")
  addrs+=("$addr")
done
export KV_NODES
KV_NODES=$(IFS=,; echo "${addrs[*]}")

echo "== waiting for $NODES node(s): $KV_NODES"
for _ in $(seq 1 100); do
  if "$KVD" stats >/dev/null 2>&1; then break; fi
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || { echo "a kvd exited; see ${TMPDIR:-/tmp}/kvd-quickstart-*.log" >&2; exit 2; }
  done
  sleep 0.1
done
"$KVD" stats >/dev/null

echo "== loading $RECORDS records"
"$KVBENCH" load --records "$RECORDS"

echo "== YCSB-B for $DURATION"
"$KVBENCH" run --records "$RECORDS" --duration "$DURATION" "$@"

echo "== node stats"
"$KVD" stats
