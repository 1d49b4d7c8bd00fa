#!/usr/bin/env bash
# Times `kvd admin add-shard` moving half of one group's keys into a group that starts empty.
set -euo pipefail
usage() {
  cat <<'TXT'
Usage: scripts/move-into-empty.sh [--records N] [--durable] [--rounds R] BIN_DIR [BIN_DIR...]

For each round and each BIN_DIR in turn (A B A B with two): starts one kvd holding every
slot (`--capacity N`) and one started `--no-slots` with no `--capacity`, so its tables grow
as the keys arrive, on 127.0.0.1; loads N records (1,000,000) into the first with kvbench;
runs `kvd admin add-shard`, which moves half of the slots (and keys) to the second in scan
order; prints the move's summary line and its wall time. `--durable`: both kvd get a fresh
`--data-dir` (`--fsync always`), removed afterwards. Stops each kvd it started, by PID.
TXT
}
RECORDS=1000000 DURABLE=0 ROUNDS=2 DIRS=()
while [ $# -gt 0 ]; do
  case $1 in
    --records) RECORDS=$2; shift 2 ;;
    --durable) DURABLE=1; shift ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --help|-h) usage; exit 0 ;;
    *) DIRS+=("$1"); shift ;;
  esac
done
if [ ${#DIRS[@]} -eq 0 ]; then usage; exit 2; fi
WORK=$(mktemp -d /tmp/move-into-empty.XXXXXX)
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

move_once() { # bin_dir
  local bin=$1 a b extra_a=() extra_b=()
  a=127.0.0.1:$(port) b=127.0.0.1:$(port)
  if [ "$DURABLE" = 1 ]; then
    extra_a=(--data-dir "$WORK/a" --fsync always) extra_b=(--data-dir "$WORK/b" --fsync always)
  fi
  "$bin/kvd" --shard 0/1 --listen "$a" --capacity "$RECORDS" "${extra_a[@]}" 2>/dev/null &
  PIDS=($!)
  "$bin/kvd" --shard 1/2 --listen "$b" --no-slots "${extra_b[@]}" 2>/dev/null &
  PIDS+=($!)
  "$bin/kvd" stats --nodes "$a,$b" --timeout 10s >/dev/null 2>&1 || sleep 2
  "$bin/kvbench" load --nodes "$a" --records "$RECORDS" --quiet >/dev/null
  /usr/bin/time -f "add-shard wall %e s" "$bin/kvd" admin add-shard --nodes "$a,$b" 2>&1 |
    grep -E "^kvd: moved|add-shard wall" | sed "s|^|$bin: |"
  kill "${PIDS[@]}"; wait "${PIDS[@]}" 2>/dev/null || true; PIDS=()
  rm -rf "$WORK/a" "$WORK/b"
}
for _ in $(seq 1 "$ROUNDS"); do
  for d in "${DIRS[@]}"; do move_once "$d"; done
done
