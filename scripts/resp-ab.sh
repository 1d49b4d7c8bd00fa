#!/usr/bin/env bash
# A B A B over RESP: redis-benchmark -P 16 -t get,set,incr against two kvd builds, alternately.
set -euo pipefail
if [ $# -ne 2 ] || [ "${1:-}" = "--help" ]; then
  cat <<'TXT'
Usage: scripts/resp-ab.sh BASE_KVD NEW_KVD

Starts each kvd in turn on 127.0.0.1 (RESP on PORT+1, default 27302) pinned to CPU 0, runs
redis-benchmark -P 16 -t get,set,incr -n 1000000 -r 1000000 -d 128 -c 50 pinned to CPU 1,
prints one line per run, and stops the kvd it started, by PID. ROUNDS (2) rounds of
BASE then NEW; ORDER=new-first swaps them.
TXT
  exit 2
fi
BASE=$1 NEW=$2 PORT=${PORT:-27301}
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null || true' EXIT
run() { # label kvd
  taskset -c 0 "$2" --listen "127.0.0.1:$PORT" --resp "127.0.0.1:$((PORT + 1))" --capacity 1000000 >/dev/null 2>&1 &
  pid=$!
  sleep 0.5
  taskset -c 1 redis-benchmark -p "$((PORT + 1))" -P 16 -t get,set,incr -n 1000000 -r 1000000 -d 128 -c 50 -q 2>/dev/null |
    tr '\r' '\n' | grep "requests per second" | awk -v l="$1" '{printf "%s %s %s  ", l, $1, $2} END {print ""}'
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
}
for _ in $(seq 1 "${ROUNDS:-2}"); do
  if [ "${ORDER:-}" = new-first ]; then run new "$NEW"; run base "$BASE"; else run base "$BASE"; run new "$NEW"; fi
done
