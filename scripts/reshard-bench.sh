#!/usr/bin/env bash
# YCSB-B throughput before, during and after `kvd admin add-shard`.
set -euo pipefail
usage() {
  cat <<'TXT'
Usage: scripts/reshard-bench.sh [--records 1000000] [--duration 40s] [--at 10] [--tasks 32]
                                [--batch 64] [--memory] [--out docs/data/reshard]

Starts 3 kvd groups of one member each (durable: --data-dir, --fsync always, unless --memory)
and a fourth started with --no-slots, all on loopback; loads RECORDS records of 128 B into
the three; runs `kvbench run -w b` (zipfian 0.99) for DURATION over all four with a
per-second timeline, and AT seconds in runs `kvd admin add-shard`, which moves a quarter of
the slots (and of the keys) to the fourth group while the load runs. Writes
OUT/timeline.{png,svg} (op/s and p99 per second), OUT/run.json and OUT/add-shard.txt (keys
moved, seconds, the longest write pause). Everything shares this machine's cores.
Uses target/release/{kvd,kvbench} (cargo build --release -p kvd -p kvbench), or KV_BIN/.
TXT
}
RECORDS=1000000 DURATION=40s AT=10 TASKS=32 BATCH=64 MEMORY=0 OUT=docs/data/reshard
while (($#)); do
  case "$1" in
    --records) RECORDS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --at) AT=$2; shift 2 ;;
    --tasks) TASKS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --memory) MEMORY=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${KV_BIN:-$ROOT/target/release}
KVD=$BIN/kvd KVBENCH=$BIN/kvbench
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/kvd-reshard.XXXXXX)
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
ADDRS=()
for i in 0 1 2 3; do
  addr=127.0.0.1:$(port)
  ADDRS+=("$addr")
  shard="$i/3" extra=()
  if [ "$i" = 3 ]; then shard="3/4" extra=(--no-slots); fi
  if [ "$MEMORY" = 0 ]; then extra+=(--data-dir "$WORK/d$i" --fsync always); fi
  "$KVD" --shard "$shard" --listen "$addr" --capacity "$RECORDS" "${extra[@]}" 2>"$WORK/kvd$i.log" &
  PIDS+=($!)
done
NODES=$(IFS=,; echo "${ADDRS[*]}")
THREE=$(IFS=,; echo "${ADDRS[*]:0:3}")
sleep 1
"$KVBENCH" load --nodes "$THREE" --records "$RECORDS" >&2
(
  sleep "$AT"
  /usr/bin/time -f "add-shard wall %e s" "$KVD" admin add-shard --nodes "$NODES" >"$OUT/add-shard.txt" 2>&1
) &
MOVER=$!
"$KVBENCH" run --nodes "$NODES" -w b --records "$RECORDS" --duration "$DURATION" --tasks "$TASKS" \
  --batch "$BATCH" --allow-failures --json "$OUT/run.json" --timeline "$OUT/timeline" -q >&2
wait "$MOVER"
grep -E "^kvd: moved|longest|add-shard wall" "$OUT/add-shard.txt" >&2 || cat "$OUT/add-shard.txt" >&2
"$KVD" admin slots --nodes "$NODES" >&2
