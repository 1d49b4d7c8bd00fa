#!/usr/bin/env bash
# The replica-group figures of docs/REPLICATION.md, in one session:
#   throughput  YCSB-B and YCSB-A with R=1 (a durable group of one) and R=3 on namespace hosts
#   failover    N leader kills (kill -9, restart 1 s later) under a recording load: how long the
#               shard answered nothing after each
#   catchup     a follower stopped while 1,000,000 records are written, then restarted: how
#               long until it has applied everything its leader committed
# Needs root (namespace hosts; the catch-up part runs on loopback ports). Bounded: every
# load has a duration, every wait a limit.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/replication-bench.sh [--parts throughput,failover,catchup] [--records N]
                                    [--duration D] [--kills N] [--cpu F] [--out DIR]

  --parts     which parts to run (default all three)
  --records   records for the throughput runs and the catch-up (default 1000000)
  --duration  each throughput run's measured time (default 10s)
  --kills     leader kills in the failover part (default 20)
  --cpu       throughput part: a CPU quota of F cores for each server host (one per member;
              run-cluster.sh --cpu), the load tool uncapped (default: no quota)
  --out       where the outputs go (default docs/data/replication)
Takes about 4 minutes with the defaults on a 2-core machine.
EOF
}

PARTS=throughput,failover,catchup
RECORDS=1000000
DURATION=10s
KILLS=20
CPU=""
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/docs/data/replication
while (($#)); do
  case "$1" in
    --parts) PARTS=$2; shift 2 ;;
    --records) RECORDS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --kills) KILLS=$2; shift 2 ;;
    --cpu) CPU=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "replication-bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# BIN_DIR: other kvd and kvbench binaries (another build, for an A B comparison).
BIN=${BIN_DIR:-$ROOT/target/release}
[[ -n ${BIN_DIR:-} ]] || (cd "$ROOT" && cargo build --release --quiet -p kvd -p kvbench)
LOGS=$(mktemp -d /tmp/kvd-replication-bench.XXXXXX)
say() { echo "== $*" >&2; }

has() { [[ ",$PARTS," == *",$1,"* ]]; }

if has throughput; then
  say "throughput: YCSB-B and YCSB-A, R=1 and R=3, $RECORDS records, $DURATION each (namespace hosts)"
  : >"$OUT/throughput.txt"
  for w in b a; do
    for r in 1 3; do
      args=(--replicas "$r" --bin-dir "$BIN")
      [[ -n $CPU ]] && args+=(--cpu "$CPU")
      ((r == 1)) && args+=(--durable)
      KV_NO_BUILD=1 "$ROOT/scripts/run-cluster.sh" --local "${args[@]}" --records "$RECORDS" --logs "$LOGS" \
        1 1 "" "-w $w --duration $DURATION" >"$LOGS/run-$w-$r.txt" 2>&1 ||
        { tail -20 "$LOGS/run-$w-$r.txt" >&2; exit 1; }
      cp "$LOGS/latest/merged.json" "$OUT/ycsb-$w-r$r.json"
      {
        echo "### YCSB-$w R=$r"
        sed -n '/^workload/,/^errors/p' "$LOGS/latest/summary.txt"
        grep -E '^\S+:7070|ROLE' "$LOGS/latest/stats-end.txt" || true
        echo
      } >>"$OUT/throughput.txt"
    done
  done
  cat "$OUT/throughput.txt"
fi

if has failover; then
  say "failover: $KILLS leader kills, one every 4 s (3 s apart plus a 1 s restart), under a recording load (namespace hosts)"
  secs=$((KILLS * 4 + 3))  # a kill 3 s after the last restart
  KV_NO_BUILD=1 "$ROOT/scripts/run-cluster.sh" --local --bin-dir "$BIN" --replicas 3 --records 10000 --logs "$LOGS" \
    --check "${secs}s" --nemesis kill --nemesis-every 3 1 1 "" "--duration 1s --warmup 200ms" \
    >"$LOGS/failover.txt" 2>&1 || { tail -20 "$LOGS/failover.txt" >&2; exit 1; }
  cp "$LOGS/latest/check.txt" "$OUT/failover-check.txt"
  cp "$LOGS/latest/nemesis.txt" "$OUT/failover-nemesis.txt"
  grep -E '^\s+kill ' "$OUT/failover-check.txt" | awk '{print $4}' | grep -E '^[0-9]+$' | sort -n >"$OUT/failover-ms.txt" || true
  n=$(wc -l <"$OUT/failover-ms.txt")
  if ((n > 0)); then
    awk -v n="$n" '{v[NR]=$1} END {printf "failover over %d kills: min %d ms, median %d ms, p90 %d ms, max %d ms\n", n, v[1], v[int((n+1)/2)], v[int(n*0.9+0.5)], v[n]}' \
      "$OUT/failover-ms.txt" | tee "$OUT/failover-summary.txt"
  fi
  grep -E '^verdict' "$OUT/failover-check.txt"
fi

if has catchup; then
  say "catch-up: a follower stopped while $RECORDS records are written, then restarted (loopback)"
  base=17470
  addrs=(127.0.0.1:$base 127.0.0.1:$((base + 1)) 127.0.0.1:$((base + 2)))
  group=$(IFS=,; echo "${addrs[*]}")
  nodes=$(IFS='|'; echo "${addrs[*]}")
  pids=()
  start() { RUST_LOG=${KVD_LOG:-kvd=info,warn} "$BIN/kvd" --listen "${addrs[$1]}" --group "$group" --data-dir "$LOGS/catchup-$1" >>"$LOGS/catchup-$1.log" 2>&1 & pids[$1]=$!; }
  trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
  for i in 0 1 2; do start "$i"; done
  for _ in $(seq 1 100); do "$BIN/kvd" stats --nodes "$nodes" --timeout 500ms >/dev/null 2>&1 && break; sleep 0.1; done
  "$BIN/kvd" admin init-group --nodes "$nodes" >/dev/null
  for _ in $(seq 1 100); do "$BIN/kvd" put --nodes "$nodes" ready yes >/dev/null 2>&1 && break; sleep 0.1; done
  role() { "$BIN/kvd" stats --nodes "${addrs[$1]}" --json --timeout 2s 2>/dev/null | python3 -c 'import json,sys; s=json.load(sys.stdin)[0]["stats"]; print(s["role"], s["applied_index"], s["commit_index"])' 2>/dev/null; }
  follower=""
  for i in 0 1 2; do [[ $(role "$i") == follower* ]] && { follower=$i; break; }; done
  [[ -n $follower ]] || { echo "replication-bench: no follower found" >&2; exit 1; }
  kill -9 "${pids[$follower]}"; wait "${pids[$follower]}" 2>/dev/null || true
  "$BIN/kvbench" load --quiet --nodes "$nodes" --records "$RECORDS" | tee "$OUT/catchup-load.txt"
  target=0
  for i in 0 1 2; do
    [[ $i == "$follower" ]] && continue
    read -r r applied commit <<<"$(role "$i")"
    [[ $r == leader ]] && target=$commit
  done
  began=$(date +%s%3N)
  start "$follower"
  done_ms=""
  for _ in $(seq 1 1200); do
    read -r _ applied _ <<<"$(role "$follower" || echo "- 0 0")"
    if ((applied >= target)); then done_ms=$(($(date +%s%3N) - began)); break; fi
    sleep 0.1
  done
  snap=$(grep -c "snapshot" "$LOGS/catchup-$follower.log" || true)
  if [[ -n $done_ms ]]; then
    echo "catch-up after $RECORDS writes: the restarted follower applied the leader's commit index $target in $done_ms ms (from its restart; log lines mentioning a snapshot: $snap)" |
      tee "$OUT/catchup-summary.txt"
  else
    echo "catch-up after $RECORDS writes: NOT done within 120 s (target $target)" | tee "$OUT/catchup-summary.txt"
    exit 1
  fi
fi
[[ -n ${KEEP_LOGS:-} ]] && echo "logs kept in $LOGS" >&2 || rm -rf "$LOGS"
