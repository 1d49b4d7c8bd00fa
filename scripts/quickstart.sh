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

# KV_NO_BUILD=1 with KV_BIN_DIR: use the binaries there as they are (the tests do).
BIN_DIR=${KV_BIN_DIR:-target/release}
if [[ ${KV_NO_BUILD:-0} != 1 ]]; then
  echo "== building (release)"
  cargo build --release --quiet -p kvd -p kvbench
fi
KVD=$BIN_DIR/kvd
KVBENCH=$BIN_DIR/kvbench

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

addrs=()
for ((i = 0; i < NODES; i++)); do
  addr="127.0.0.1:$((BASE_PORT + i))"
  "$KVD" --shard "$i/$NODES" --listen "$addr" --capacity "$((RECORDS / NODES + 1))" 2>"${TMPDIR:-/tmp}/kvd-quickstart-$i.log" &
  pids+=("$!")
  addrs+=("$addr")
done
export KV_NODES
KV_NODES=$(IFS=,; echo "${addrs[*]}")

# ours: whether every address answers as the kvd this script started there (its pid in
# stats), so that a cluster already on these ports is never loaded or benchmarked.
ours() {
  local got
  got=$("$KVD" stats --json --timeout 1s 2>/dev/null | grep -o '"pid": [0-9]*' | grep -o '[0-9]*$' | tr '\n' ' ') || return 1
  [[ $got == "${pids[*]} " ]]
}

echo "== waiting for $NODES node(s): $KV_NODES"
for _ in $(seq 1 100); do
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || {
      echo "a kvd this script started exited (is something else on ports $BASE_PORT..$((BASE_PORT + NODES - 1))? set BASE_PORT); see ${TMPDIR:-/tmp}/kvd-quickstart-*.log" >&2
      tail -n 3 "${TMPDIR:-/tmp}"/kvd-quickstart-*.log >&2 || true
      exit 2
    }
  done
  if ours; then break; fi
  sleep 0.1
done
ours || {
  echo "the nodes on $KV_NODES are not the ones this script started (pids ${pids[*]}); refusing to load or benchmark them" >&2
  exit 2
}

echo "== loading $RECORDS records"
"$KVBENCH" load --records "$RECORDS"

echo "== YCSB-B for $DURATION"
"$KVBENCH" run --records "$RECORDS" --duration "$DURATION" "$@"

echo "== node stats"
"$KVD" stats
