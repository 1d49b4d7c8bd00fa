#!/usr/bin/env bash
# usage: run.sh BIN SNAPSHOT_EVERY OUT  — one 0.15-core durable kvd, 200k records, 32 tasks B for 40 s
set -euo pipefail
BIN=$1 SE=$2 OUT=$3
LC=$(cd "$(dirname "$0")/../../../.." && pwd)/scripts/local-cluster.sh
export KV_NS_PREFIX=snx
mkdir -p "$OUT"; WORK=$(mktemp -d ${WORKROOT:-/tmp}/snx.XXXX)
"$LC" up 2 --cpu ${CPU:-0.15} --cpu-period-us 10000 --uncapped 1 >/dev/null
A=$("$LC" addr 0):7070
( exec "$LC" exec 0 "$BIN/kvd" --shard 0/1 --listen "$A" --data-dir "$WORK/d" --snapshot-every "$SE" --insecure-no-auth ${KVD_EXTRA:-} >"$OUT/kvd.log" 2>&1 ) &
KPID=$!
for _ in $(seq 100); do "$LC" exec 1 "$BIN/kvd" stats --nodes "$A" --timeout 300ms >/dev/null 2>&1 && break; sleep 0.1; done
"$LC" exec 1 "$BIN/kvbench" load --quiet --nodes "$A" --records ${RECORDS:-200000} >/dev/null
"$LC" exec 1 "$BIN/kvbench" run --quiet --nodes "$A" --records ${RECORDS:-200000} --tasks 32 --warmup 0s --duration 40s --json "$OUT/run.json" --timeline "$OUT/tl" --allow-failures >/dev/null || true
kill "$KPID"; wait "$KPID" 2>/dev/null || true
"$LC" down >/dev/null; rm -rf "$WORK"
grep -o 'took_ms=[0-9]*\|pairs=[0-9]*' "$OUT/kvd.log" | paste -sd' ' 
python3 - "$OUT/run.json" <<'PY'
import json,sys
j=json.load(open(sys.argv[1]))
print("ops/s", round(j.get("ops_per_sec",0)))
tl=j.get("node_timeline")
if tl:
  import itertools
  print(json.dumps(tl)[:600])
PY
