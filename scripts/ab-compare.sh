#!/usr/bin/env bash
# A B A B: the course YCSB-B against two builds, alternately, in one session.
set -euo pipefail
usage() {
  cat <<'TXT'
Usage: scripts/ab-compare.sh BASE_BIN_DIR NEW_BIN_DIR

Runs, for each round and batch size, one kvd + `kvbench load` (1,000,000 records) +
`kvbench run` (YCSB-B, zipfian 0.99, 2 s warm-up, 8 s) with the binaries in BASE_BIN_DIR,
then the same with NEW_BIN_DIR, on 127.0.0.1. Prints one line per run: op/s, kvd CPU,
kvbench CPU. Stops each kvd it started, by PID.

Environment: ROUNDS (2), BATCHES ("64 8192"), PORT (17900), DURATION (8s).

Build the old side with e.g.
  git worktree add /tmp/base <commit> && (cd /tmp/base && cargo build --release -p kvd -p kvbench)
then: scripts/ab-compare.sh /tmp/base/target/release target/release
TXT
}
if [ $# -ne 2 ] || [ "${1:-}" = "--help" ]; then usage; exit 2; fi
BASE=$1 NEW=$2
PORT=${PORT:-17900}
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null || true' EXIT

run_one() { # label bindir batch
  local label=$1 dir=$2 batch=$3 out
  "$dir/kvd" --listen "127.0.0.1:$PORT" --capacity 1000000 >/dev/null 2>&1 &
  pid=$!
  "$dir/kvd" stats --nodes "127.0.0.1:$PORT" --timeout 5s >/dev/null 2>&1 || sleep 1
  "$dir/kvbench" load --nodes "127.0.0.1:$PORT" --quiet >/dev/null
  out=$("$dir/kvbench" run --nodes "127.0.0.1:$PORT" --batch "$batch" --warmup 2s \
    --duration "${DURATION:-8s}" --quiet 2>/dev/null || true)
  printf '%-5s batch %-5s %14s op/s   kvd %-9s kvbench CPU %s\n' "$label" "$batch" \
    "$(echo "$out" | awk '/^throughput/ {print $2}')" \
    "$(echo "$out" | grep -o 'CPU [0-9]*%' | head -1)" \
    "$(echo "$out" | awk '/^client CPU/ {print $3}')"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
}
for _ in $(seq 1 "${ROUNDS:-2}"); do
  for batch in ${BATCHES:-64 8192}; do
    run_one base "$BASE" "$batch"
    run_one new "$NEW" "$batch"
  done
done
