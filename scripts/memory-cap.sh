#!/usr/bin/env bash
# RSS against --max-memory: for each cap, start kvd with it, write more 128-byte records than
# fit (kvbench load), and print the cap, what kvd accounts, its RSS, and RSS - cap.
set -euo pipefail
if [ "${1:-}" = "--help" ]; then
  cat <<'TXT'
Usage: scripts/memory-cap.sh [CAP...]     (default: 50mb 100mb 200mb 400mb)

Environment: RECORDS (3000000, about 550 MB accounted), PORT (17960), BIN (target/release).
Starts and stops (by PID) one kvd per cap on 127.0.0.1.
TXT
  exit 0
fi
BIN=${BIN:-target/release}
PORT=${PORT:-17960}
RECORDS=${RECORDS:-3000000}
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null || true' EXIT
printf '%-8s %14s %10s %10s %12s %10s\n' cap accounted RSS "RSS-cap" keys evicted
for cap in "${@:-50mb 100mb 200mb 400mb}"; do
  for c in $cap; do
    "$BIN/kvd" --listen "127.0.0.1:$PORT" --max-memory "$c" >/dev/null 2>&1 &
    pid=$!
    "$BIN/kvd" stats --nodes "127.0.0.1:$PORT" --timeout 5s >/dev/null 2>&1 || sleep 1
    "$BIN/kvbench" load --nodes "127.0.0.1:$PORT" --records "$RECORDS" --quiet >/dev/null 2>&1 || true
    json=$("$BIN/kvd" stats --nodes "127.0.0.1:$PORT" --json)
    python3 - "$c" "$json" <<'PY'
import json, sys
s = json.loads(sys.argv[2])[0]["stats"]
cap, used, rss = s["max_memory_bytes"], s["memory_used_bytes"], s["process_rss_bytes"]
mb = lambda b: f"{b / 1e6:.1f} MB"
print(f"{sys.argv[1]:<8} {mb(used):>14} {mb(rss):>10} {mb(rss - cap):>10} {s['keys']:>12,} {s['evicted']:>10,}")
PY
    kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  done
done
