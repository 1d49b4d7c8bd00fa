#!/usr/bin/env bash
# Scaling online: a cluster grown from 2 to 4 shard groups under load (kvd admin add-shard)
# against one started with 4, on hosts of a fixed CPU quota each, A B A B.
set -euo pipefail
usage() {
  cat <<'TXT'
Usage: scripts/grow-bench.sh [--cpu 0.2] [--records 1000000] [--duration 10s] [--rounds 2]
                             [--tasks 32] [--batch 512] [--durable] [--uniform]
                             [--moves load|quiet|empty] [--by-load] [--out docs/data/grow]

Hosts (network namespaces, scripts/local-cluster.sh): 4 server hosts capped at --cpu cores
each (10 ms quota periods), one client host uncapped (kvbench, kvd admin). Each round runs,
on fresh servers:

  started  kvd --shard i/4 on the 4 hosts; `kvbench load`; `kvbench run -w b` (YCSB-B,
           zipfian 0.99, 128 B values) over the 4
  grown    kvd --shard 0/2 and 1/2 on hosts 0 and 1, and hosts 2 and 3 started empty
           (--shard 2/3 --no-slots, --shard 3/4 --no-slots); `kvbench load` into the two;
           a run over all four (the 2-group figure: hosts 2 and 3 serve nothing); then, with
           a load running, `kvd admin add-shard` for group 2, then for group 3 (slots and
           keys move online); then the same run as `started`

--moves says how the grown cluster gets its slots: `load` (default) as above; `quiet`: the
same moves with no load running; `empty`: add-shard before anything is loaded (no key moves:
the grown layout alone), then the load into all four.
--by-load then runs `kvd admin rebalance --by load --window 3s` under the same load and
measures the grown cluster again (phase 4-groups-by-load; OUT/by-load-rN.txt).
--uniform runs `-w read-mostly --contention low` (90% get / 10% update, uniform keys)
instead of YCSB-B: under zipfian 0.99 one key takes ~7% of the ops and the ten hottest
~20%, so which group holds them (any even split, grown or not) decides how even the load is.
--durable gives every kvd --data-dir (on tmpfs under /tmp) and --fsync always. Writes
OUT/grow.csv (round, set-up, phase, op/s, batch p50/p99, kvbench CPU, per-host kvd CPU and op/s),
OUT/add-shard-rN.txt (each move: keys, seconds, longest write pause) and OUT/grow.png + .svg.
Root (namespaces, cgroups). About 1.5 minutes per round.
TXT
}
CPU=0.2 RECORDS=1000000 DURATION=10s ROUNDS=2 TASKS=32 BATCH=512 DURABLE=0 OUT=docs/data/grow
WORKLOAD=(-w b) MOVES=load BY_LOAD=0
while (($#)); do
  case "$1" in
    --cpu) CPU=$2; shift 2 ;;
    --records) RECORDS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --tasks) TASKS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --durable) DURABLE=1; shift ;;
    --uniform) WORKLOAD=(-w read-mostly --contention low); shift ;;
    --moves) MOVES=$2; shift 2 ;;
    --by-load) BY_LOAD=1; shift ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
case $MOVES in load|quiet|empty) ;; *) echo "grow-bench: --moves takes load, quiet or empty" >&2; exit 2 ;; esac
((EUID == 0)) || { echo "grow-bench: needs root (network namespaces, cgroups)" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${KV_BIN:-$ROOT/target/release}
[[ -x $BIN/kvd && -x $BIN/kvbench ]] || (cd "$ROOT" && cargo build --release --quiet -p kvd -p kvbench)
export KV_NS_PREFIX=kvg
LC="$ROOT/scripts/local-cluster.sh"
CLIENT=4
WORK=$(mktemp -d /tmp/kvd-grow.XXXXXX)
mkdir -p "$OUT"
TOKEN="$WORK/token"
(umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$TOKEN")
AUTH=(--auth-token-file "$TOKEN")
PIDS=()

say() { echo "grow-bench: $*" >&2; }
stop_all() {
  local p
  for p in "${PIDS[@]+"${PIDS[@]}"}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]+"${PIDS[@]}"}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
cleanup() {
  stop_all
  "$LC" down >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

"$LC" up $((CLIENT + 1)) --cpu "$CPU" --cpu-period-us 10000 --uncapped "$CLIENT" >/dev/null
addr() { echo "$("$LC" addr "$1"):7070"; }
on() { local h=$1; shift; "$LC" exec "$h" "$@"; }
# spawn HOST CMD...: CMD on host HOST as the process whose PID $! gives (exec all the way).
spawn() { local h=$1; shift; exec "$LC" exec "$h" "$@"; }
kvd_on() { # HOST SHARD ARGS...
  local h=$1 shard=$2; shift 2
  local extra=()
  if [ "$DURABLE" = 1 ]; then extra=(--data-dir "$WORK/data/h$h" --fsync always); fi
  (spawn "$h" "$BIN/kvd" --shard "$shard" --listen "$(addr "$h")" --capacity "$RECORDS" \
    "${AUTH[@]}" "${extra[@]}" "$@" >>"$WORK/kvd-h$h.log" 2>&1) &
  PIDS+=($!)
}
wait_up() {
  local h
  for h in 0 1 2 3; do
    for _ in $(seq 1 100); do
      on "$CLIENT" "$BIN/kvd" stats --nodes "$(addr "$h")" --timeout 300ms "${AUTH[@]}" >/dev/null 2>&1 && continue 2
      sleep 0.1
    done
    say "host $h did not come up; its log:"; tail -5 "$WORK/kvd-h$h.log" >&2; exit 1
  done
}
ALL=$(for h in 0 1 2 3; do addr "$h"; done | paste -sd,)
TWO=$(for h in 0 1; do addr "$h"; done | paste -sd,)
THREE=$(for h in 0 1 2; do addr "$h"; done | paste -sd,)
CSV="$OUT/grow.csv"
echo "round,setup,phase,ops_per_sec,batch_p50_us,batch_p99_us,client_cpu_percent,kvd_cpu_percent,node_ops_per_sec,failed_ops,redirected" >"$CSV"

run() { # ROUND SETUP PHASE: one measured run over the four hosts, a CSV row
  local json="$WORK/run.json"
  on "$CLIENT" "$BIN/kvbench" run --quiet --nodes "$ALL" --records "$RECORDS" "${WORKLOAD[@]}" --tasks "$TASKS" \
    --batch "$BATCH" --warmup 2s --duration "$DURATION" --json "$json" "${AUTH[@]}" >/dev/null
  python3 - "$json" "$1" "$2" "$3" >>"$CSV" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
b = d["latency_us"].get("batch", {})
cpu = " ".join(f"{(n.get('server') or {}).get('cpu_percent', 0):.0f}" for n in d["per_node"])
ops = " ".join(f"{n['ops_per_sec']:.0f}" for n in d["per_node"])
print(",".join([sys.argv[2], sys.argv[3], sys.argv[4], f"{d['ops_per_sec']:.0f}",
                f"{b.get('p50_us', 0):.0f}", f"{b.get('p99_us', 0):.0f}",
                f"{d['client_cpu_percent']:.0f}", cpu, ops, str(d["failed_ops"]), str(d.get("redirected", 0))]))
PY
  tail -1 "$CSV" >&2
}

add_shards() { # group 2 joins (3 groups), then group 3 (4)
  {
    on "$CLIENT" /usr/bin/time -f "add-shard group 2: wall %e s" "$BIN/kvd" admin add-shard --nodes "$THREE" \
      --group 2 "${AUTH[@]}"
    on "$CLIENT" /usr/bin/time -f "add-shard group 3: wall %e s" "$BIN/kvd" admin add-shard --nodes "$ALL" \
      --group 3 "${AUTH[@]}"
  } >"$OUT/add-shard-r$round.txt" 2>&1
}

for round in $(seq 1 "$ROUNDS"); do
  say "round $round: started with 4 groups, $CPU cores per server host"
  rm -rf "$WORK/data" "$WORK"/kvd-*.log
  for h in 0 1 2 3; do kvd_on "$h" "$h/4"; done
  wait_up
  on "$CLIENT" "$BIN/kvbench" load --quiet --nodes "$ALL" --records "$RECORDS" "${AUTH[@]}" >/dev/null
  run "$round" started 4-groups
  stop_all

  say "round $round: 2 groups, grown to 4 (moves: $MOVES)"
  rm -rf "$WORK/data" "$WORK"/kvd-*.log
  kvd_on 0 0/2
  kvd_on 1 1/2
  kvd_on 2 2/3 --no-slots
  kvd_on 3 3/4 --no-slots
  wait_up
  if [ "$MOVES" = empty ]; then
    add_shards
    on "$CLIENT" "$BIN/kvbench" load --quiet --nodes "$ALL" --records "$RECORDS" "${AUTH[@]}" >/dev/null
  else
    on "$CLIENT" "$BIN/kvbench" load --quiet --nodes "$TWO" --records "$RECORDS" "${AUTH[@]}" >/dev/null
    run "$round" grown 2-groups
    load_pid=""
    if [ "$MOVES" = load ]; then
      # The moves run under a load (not measured: its figure is the add-shard timeline in
      # reshard-bench.sh); the load ends when the moves do.
      (spawn "$CLIENT" "$BIN/kvbench" run --quiet --nodes "$ALL" --records "$RECORDS" "${WORKLOAD[@]}" \
        --tasks "$TASKS" --batch "$BATCH" --duration 120s --allow-failures "${AUTH[@]}" >/dev/null 2>&1) &
      load_pid=$!
      sleep 2
    fi
    add_shards
    if [ -n "$load_pid" ]; then
      kill "$load_pid" 2>/dev/null || true
      wait "$load_pid" 2>/dev/null || true
    fi
  fi
  grep -E "^kvd: moved|wall" "$OUT/add-shard-r$round.txt" >&2 || true
  on "$CLIENT" "$BIN/kvd" admin slots --nodes "$ALL" "${AUTH[@]}" >&2
  run "$round" grown 4-groups
  if [ "$BY_LOAD" = 1 ]; then
    # Under the same load, hot slots move to the idlest groups; then measured again.
    (spawn "$CLIENT" "$BIN/kvbench" run --quiet --nodes "$ALL" --records "$RECORDS" "${WORKLOAD[@]}" \
      --tasks "$TASKS" --batch "$BATCH" --duration 120s --allow-failures "${AUTH[@]}" >/dev/null 2>&1) &
    load_pid=$!
    sleep 2
    on "$CLIENT" "$BIN/kvd" admin rebalance --by load --window 3s --nodes "$ALL" "${AUTH[@]}" \
      >"$OUT/by-load-r$round.txt" 2>&1
    kill "$load_pid" 2>/dev/null || true
    wait "$load_pid" 2>/dev/null || true
    grep -E "^kvd: (group|moving)" "$OUT/by-load-r$round.txt" >&2 || true
    run "$round" grown 4-groups-by-load
  fi
  stop_all
done

python3 -c 'import matplotlib' 2>/dev/null || pip install --quiet matplotlib >&2
python3 - "$CSV" "$OUT" "$CPU" "${WORKLOAD[*]}" <<'PY'
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = list(csv.DictReader(open(sys.argv[1])))
kinds = [("started", "4-groups", "started with 4"), ("grown", "2-groups", "2 groups (before add-shard)"),
         ("grown", "4-groups", "grown 2 -> 4 online"), ("grown", "4-groups-by-load", "then rebalance --by load")]
kinds = [k for k in kinds if any(r["setup"] == k[0] and r["phase"] == k[1] for r in rows)]
fig, ax = plt.subplots(figsize=(7, 4.2))
for x, (setup, phase, label) in enumerate(kinds):
    ys = [float(r["ops_per_sec"]) / 1e6 for r in rows if r["setup"] == setup and r["phase"] == phase]
    ax.scatter([x] * len(ys), ys, s=30)
    if ys:
        ax.bar(x, sum(ys) / len(ys), alpha=0.3)
ax.set_xticks(range(len(kinds)), [k[2] for k in kinds])
ax.set_ylabel(f"op/s (millions), kvbench {sys.argv[4]}")
ax.set_title(f"Growing online against starting with 4, server hosts capped at {sys.argv[3]} cores")
ax.set_ylim(bottom=0)
ax.grid(alpha=0.3, axis="y")
fig.tight_layout()
for ext in ("png", "svg"):
    fig.savefig(f"{sys.argv[2]}/grow.{ext}", dpi=110)
PY
say "wrote $CSV and $OUT/grow.png"
