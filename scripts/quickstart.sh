#!/usr/bin/env bash
# Start a local kvd cluster on loopback, load it, benchmark it with YCSB-B, print the result,
# and stop the nodes again (only the ones this script started, by PID).
#
#   scripts/quickstart.sh                 # 2 nodes, 1,000,000 records, 10 s of YCSB-B
#   NODES=1 DURATION=5s scripts/quickstart.sh --batch 8192
#
# Environment: NODES (2), BASE_PORT (7070; 0: any free ports, read from each node's ready
# line), RECORDS (1000000), DURATION (10s), KV_LOG_DIR (where the nodes' logs go; default a
# new temporary directory, removed when the script succeeds and named when it fails).
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

if [[ -n ${KV_LOG_DIR:-} ]]; then
  LOGS=$KV_LOG_DIR
  OWN_LOGS=0
else
  LOGS=$(mktemp -d "${TMPDIR:-/tmp}/kvd-quickstart.XXXXXX")
  OWN_LOGS=1
fi

pids=()
cleanup() {
  local rc=$?
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [[ $OWN_LOGS == 1 ]]; then
    if [[ $rc == 0 ]]; then rm -rf "$LOGS"; else echo "the nodes' logs are in $LOGS" >&2; fi
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for ((i = 0; i < NODES; i++)); do
  if [[ $BASE_PORT == 0 ]]; then listen="127.0.0.1:0"; else listen="127.0.0.1:$((BASE_PORT + i))"; fi
  "$KVD" --shard "$i/$NODES" --listen "$listen" --capacity "$((RECORDS / NODES + 1))" 2>"$LOGS/kvd-$i.log" &
  pids+=("$!")
done

# Each node's address, from its ready line ("... listening on ADDR").
addrs=()
for ((i = 0; i < NODES; i++)); do
  addr=""
  for _ in $(seq 1 600); do
    addr=$(grep -o 'listening on [^ ]*' "$LOGS/kvd-$i.log" 2>/dev/null | head -1 | cut -d' ' -f3) || true
    [[ -n $addr ]] && break
    kill -0 "${pids[$i]}" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z $addr ]]; then
    echo "a kvd this script started exited or printed no ready line (is something else on ports $BASE_PORT..$((BASE_PORT + NODES - 1))? set BASE_PORT, or BASE_PORT=0 for any free ports):" >&2
    tail -n 3 "$LOGS/kvd-$i.log" >&2 || true
    exit 2
  fi
  addrs+=("$addr")
done
export KV_NODES
KV_NODES=$(IFS=,; echo "${addrs[*]}")

# ours: whether every address answers as the kvd this script started there (its pid in
# stats), so that a cluster already on these ports is never loaded or benchmarked.
ours() {
  local got
  got=$("$KVD" stats --json --timeout 10s 2>/dev/null | grep -o '"pid": [0-9]*' | grep -o '[0-9]*$' | tr '\n' ' ') || return 1
  [[ $got == "${pids[*]} " ]]
}

echo "== $NODES node(s): $KV_NODES"
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
