#!/usr/bin/env bash
# RSS against --max-memory under a flood of mixed value sizes (issue 58): for each eviction
# policy, start kvd with --max-memory CAP and --resp, run redis-benchmark SETs of 100 B, 4 KiB,
# 64 KiB and 1 MiB values over random keys at once for DURATION, sampling kvd's RSS; print
# the store's accounting, the peak RSS while flooding, and the RSS 5 s after.
set -euo pipefail
if [ "${1:-}" = "--help" ]; then
  cat <<'TXT'
Usage: scripts/memory-flood.sh [POLICY...]   (default: lru random none volatile-lru)

Environment: CAP (64mb), DURATION (20, seconds), PORT (17970), BIN (target/release),
CLIENTS (4 per size). Starts and stops (by PID) one kvd per policy on 127.0.0.1, and the
redis-benchmark processes it runs.
TXT
  exit 0
fi
BIN=${BIN:-target/release}
PORT=${PORT:-17970}
CAP=${CAP:-64mb}
DURATION=${DURATION:-20}
CLIENTS=${CLIENTS:-4}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
printf '%-14s %10s %12s %12s %12s\n' policy cap accounted "peak RSS" "RSS after"
for policy in "${@:-lru random none volatile-lru}"; do
  for p in $policy; do
    resp=$((PORT + 1))
    "$BIN/kvd" --listen "127.0.0.1:$PORT" --resp "127.0.0.1:$resp" --max-memory "$CAP" --eviction "$p" >/dev/null 2>&1 &
    kvd=$!
    pids=("$kvd")
    "$BIN/kvd" stats --nodes "127.0.0.1:$PORT" --timeout 5s >/dev/null 2>&1 || sleep 1
    for size in 100 4096 65536 1048576; do
      # -r: random keys out of 100,000; -n large, ended by kill after DURATION.
      redis-benchmark -h 127.0.0.1 -p "$resp" -t set -d "$size" -r 100000 -n 100000000 -c "$CLIENTS" -P 4 -q >/dev/null 2>&1 &
      pids+=("$!")
    done
    peak=0
    for _ in $(seq 1 $((DURATION * 4))); do
      r=$(rss_kb "$kvd"); [ "$r" -gt "$peak" ] && peak=$r
      sleep 0.25
    done
    for p2 in "${pids[@]:1}"; do kill "$p2" 2>/dev/null || true; wait "$p2" 2>/dev/null || true; done
    sleep 5
    after=$(rss_kb "$kvd")
    used=$("$BIN/kvd" stats --nodes "127.0.0.1:$PORT" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats"]["memory_used_bytes"])')
    printf '%-14s %10s %10.1f MB %9.1f MB %9.1f MB\n' "$p" "$CAP" "$(echo "$used/1000000" | bc -l)" "$(echo "$peak/1000" | bc -l)" "$(echo "$after/1000" | bc -l)"
    kill "$kvd"; wait "$kvd" 2>/dev/null || true
    pids=()
  done
done
