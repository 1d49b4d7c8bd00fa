#!/usr/bin/env bash
# A B A B: YCSB-B (1M records, 128 B values, 95% get, zipfian 0.99) against two builds, alternately, in one session.
set -euo pipefail
usage() {
  cat <<'TXT'
Usage: scripts/ab-compare.sh BASE_BIN_DIR NEW_BIN_DIR

Runs, for each round and batch size, one kvd + `kvbench load` (1,000,000 records) +
`kvbench run` (YCSB-B, zipfian 0.99, 2 s warm-up, 8 s) with the binaries in BASE_BIN_DIR,
then the same with NEW_BIN_DIR, on 127.0.0.1. Prints one line per run: op/s, kvd CPU,
kvbench CPU. Stops each kvd it started, by PID.

Environment: ROUNDS (2), BATCHES ("64 8192"), PORT (17900), DURATION (8s), WORKLOAD
(b; any of kvbench's -w), DATA_DIRS (set: each kvd gets a fresh --data-dir under it,
removed after the run, for the durable mode; add --fsync to the KVD_ARGS); extra
arguments for each side's kvd and clients: BASE_KVD_ARGS, NEW_KVD_ARGS, BASE_CLIENT_ARGS,
NEW_CLIENT_ARGS (e.g. to compare plain TCP with TLS using one build:
  NEW_KVD_ARGS="--tls-cert c.pem --tls-key k.pem" NEW_CLIENT_ARGS="--tls-ca c.pem" \
  scripts/ab-compare.sh target/release target/release).

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

run_one() { # label bindir batch "kvd args" "client args"
  local label=$1 dir=$2 batch=$3 kvd_args=$4 client_args=$5 out data=""
  if [ -n "${DATA_DIRS:-}" ]; then
    data=$(mktemp -d "${DATA_DIRS}/ab.XXXXXX")
    kvd_args="$kvd_args --data-dir $data"
  fi
  # shellcheck disable=SC2086 # the extra args are lists of words by design
  "$dir/kvd" --listen "127.0.0.1:$PORT" --capacity 1000000 $kvd_args >/dev/null 2>&1 &
  pid=$!
  # shellcheck disable=SC2086
  "$dir/kvd" stats --nodes "127.0.0.1:$PORT" --timeout 5s $client_args >/dev/null 2>&1 || sleep 1
  # shellcheck disable=SC2086
  "$dir/kvbench" load --nodes "127.0.0.1:$PORT" --quiet $client_args >/dev/null
  # shellcheck disable=SC2086
  out=$("$dir/kvbench" run --nodes "127.0.0.1:$PORT" -w "${WORKLOAD:-b}" --batch "$batch" --warmup 2s \
    --duration "${DURATION:-8s}" --quiet $client_args 2>/dev/null || true)
  printf '%-5s batch %-5s %14s op/s   kvd %-9s kvbench CPU %s\n' "$label" "$batch" \
    "$(echo "$out" | awk '/^throughput/ {print $2}')" \
    "$(echo "$out" | grep -o 'CPU [0-9]*%' | head -1)" \
    "$(echo "$out" | awk '/^client CPU/ {print $3}')"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  if [ -n "$data" ]; then rm -rf "$data"; fi
}
for _ in $(seq 1 "${ROUNDS:-2}"); do
  for batch in ${BATCHES:-64 8192}; do
    run_one base "$BASE" "$batch" "${BASE_KVD_ARGS:-}" "${BASE_CLIENT_ARGS:-}"
    run_one new "$NEW" "$batch" "${NEW_KVD_ARGS:-}" "${NEW_CLIENT_ARGS:-}"
  done
done
