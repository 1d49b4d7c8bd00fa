#!/usr/bin/env bash
# A hot spot that moves between shards, on hosts of a fixed CPU quota: one replica per
# shard, a fixed set of replicas per shard, and the shard manager (kvd manager) adding read
# replicas where the load is, all on the same hosts, in one session.
set -euo pipefail
usage() {
  cat <<'TXT'
Usage: scripts/hotspot-bench.sh [--cpu 0.15] [--shards 3] [--extra 3] [--tasks "32 128"]
                                [--phase 12s] [--hot-ops 0.8] [--records 200000] [--rounds 1]
                                [--setups "fixed1 fixedR fixedRall manager manager-slots ..."]
                                [--check 20s] [--spread-above 1.6] [--up-after 3] [--interval-ms 100]
                                [--snapshot-every 64mib]
                                [--out docs/data/manager]

Hosts (network namespaces, scripts/local-cluster.sh), every one capped at --cpu cores (over
10 ms periods) except the client host: S shard hosts, E extra hosts, one client host (kvbench and the manager).
Every shard is a durable replica group (--group, --data-dir, fsync always) led by its
shard host. The extra hosts are used three ways:

  fixed1   not at all: one replica per shard
  fixedR   host S+k holds a learner of shard k mod S (kvd admin add-replica --learner),
           for the whole run: each shard has 1 + E/S replicas
  fixedRall
           each extra host holds a learner of every shard for the whole run: 1 + E
           replicas per shard (the most the extra hosts allow)
  manager  each extra host runs a spare of every shard (kvd --join); kvd manager adds a
           spare of a hot shard as a learner and removes it when the shard cools (at most
           1 + E members per shard)
  manager-slots
           each extra host runs a spare group holding no slot (--no-slots); kvd manager
           --move-slots moves a hot group's busiest slots to the idlest groups (every key
           keeps one copy: one replica per key, as fixed1); --spread-above is the
           manager's (how far above the mean load the busiest group may go), --up-after
           its intervals (of --interval-ms, 100 by default) in a row above it before it
           moves (one at twice --spread-above); it leaves 1 s alone after a move and evens
           out what stays 1.25x the mean for 2 s

Clients spread batches of reads over each group's members (--split-reads, --reads replicas:
linearizable follower reads; a set-up named NAME-stale is NAME with --reads stale
--max-staleness 500ms: members answer from their own store, no read index). For each set-up and each task count, one run of
`kvbench run -w hotkey --phases 0:P,1:P,...` (the hot spot on shard 0, then 1, ...; --hot-ops
of the ops on the hot shard), 2 cycles of the phases. With --check D each manager set-up
then records a history with `kvbench check` for D beside the same load while the manager
works (first task count only; OUT/check-SETUP.txt; a -stale set-up is checked against its
staleness bound, the others for linearizability), and its verdict goes in
the CSV.

Writes OUT/hotspot.csv (per run and shard: reads-only batch and write batch round trips,
mean and p99, and the run's op/s), OUT/<setup>-t<T>.json (kvbench's results),
OUT/<setup>-t<T>-timeline.png (each shard's p99 per second), OUT/<setup>-t<T>.log (the
manager's decisions), and OUT/hotspot.png + .svg (hot shard read p99 and throughput per
set-up). --snapshot-every is every kvd's (its default, 64mib, is kvd's; 4gib: no snapshot in
a run). KEEP_LOGS=1 keeps each run's kvd logs in OUT/<setup>-t<T>-kvd-logs/. Root
(namespaces, cgroups). About 2 minutes per run. KVD_BIN=DIR runs the kvd and
kvbench of DIR (another build, for A B A B) instead of this checkout's.
TXT
}
SNAPSHOT_EVERY=64mib SPREAD_ABOVE=1.6 UP_AFTER=3 INTERVAL_MS=100 CPU=0.15 SHARDS=3 EXTRA=3 TASKS="32 128" PHASE=12s HOT_OPS=0.8 RECORDS=200000 ROUNDS=1
SETUPS="fixed1 fixedR fixedRall manager manager-slots fixedR-stale manager-slots-stale" CHECK="" OUT=docs/data/manager
while (($#)); do
  case "$1" in
    --cpu) CPU=$2; shift 2 ;;
    --shards) SHARDS=$2; shift 2 ;;
    --extra) EXTRA=$2; shift 2 ;;
    --tasks) TASKS=$2; shift 2 ;;
    --phase) PHASE=$2; shift 2 ;;
    --hot-ops) HOT_OPS=$2; shift 2 ;;
    --records) RECORDS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --setups) SETUPS=$2; shift 2 ;;
    --check) CHECK=$2; shift 2 ;;
    --spread-above) SPREAD_ABOVE=$2; shift 2 ;;
    --up-after) UP_AFTER=$2; shift 2 ;;
    --interval-ms) INTERVAL_MS=$2; shift 2 ;;
    --snapshot-every) SNAPSHOT_EVERY=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
((EUID == 0)) || { echo "hotspot-bench: needs root (network namespaces, cgroups)" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN="${KVD_BIN:-$ROOT/target/release}"
[[ -n ${KVD_BIN:-} || (-x $BIN/kvd && -x $BIN/kvbench) ]] || (cd "$ROOT" && cargo build --release --quiet)
[[ -x $BIN/kvd && -x $BIN/kvbench ]] || { echo "hotspot-bench: no kvd and kvbench in $BIN" >&2; exit 2; }
export KV_NS_PREFIX=kvm
LC="$ROOT/scripts/local-cluster.sh"
CLIENT=$((SHARDS + EXTRA))
WORK=$(mktemp -d /tmp/kvd-hotspot.XXXXXX)
mkdir -p "$OUT"
TOKEN="$WORK/token"
(umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$TOKEN")
AUTH=(--auth-token-file "$TOKEN")
PIDS=()

say() { echo "hotspot-bench: $*" >&2; }
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

# A 10 ms quota period: with the default 100 ms, a host that uses up its quota stalls for up
# to 85 ms, and every shard's p99 is that stall whatever the load.
"$LC" up $((CLIENT + 1)) --cpu "$CPU" --cpu-period-us 10000 --uncapped "$CLIENT" >/dev/null
addr() { echo "$("$LC" addr "$1"):$((7070 + ${2:-0}))"; }
on() { local h=$1; shift; "$LC" exec "$h" "$@"; }
# spawn HOST CMD...: CMD on host HOST in the background, as the process whose PID $! gives
# (local-cluster.sh exec and ip netns exec both exec), so stop_all ends it and only it.
spawn() { local h=$1; shift; exec "$LC" exec "$h" "$@"; }
# kvd HOST PORT_OFFSET SHARD ARGS...: a kvd on host HOST for shard SHARD, in the background.
kvd_on() {
  local h=$1 off=$2 shard=$3; shift 3
  local dir="$WORK/data/h$h-s$shard"
  mkdir -p "$dir"
  (spawn "$h" "$BIN/kvd" --shard "$shard/$SHARDS" --listen "$(addr "$h" "$off")" --data-dir "$dir" \
    --snapshot-every "$SNAPSHOT_EVERY" "${AUTH[@]}" "$@" >>"$WORK/kvd-h$h.log" 2>&1) &
  PIDS+=($!)
}
wait_up() {
  local a
  for a in "$@"; do
    for _ in $(seq 1 100); do
      on "$CLIENT" "$BIN/kvd" stats --nodes "$a" --timeout 300ms "${AUTH[@]}" >/dev/null 2>&1 && continue 2
      sleep 0.1
    done
    say "$a did not come up; its log:"; tail -5 "$WORK"/kvd-*.log >&2; exit 1
  done
}

NODES=$(for s in $(seq 0 $((SHARDS - 1))); do addr "$s"; done | paste -sd,)
[[ $PHASE =~ ^[0-9]+s$ ]] || { echo "hotspot-bench: --phase takes whole seconds (e.g. 12s)" >&2; exit 2; }
PHASES=$(for c in 1 2; do for s in $(seq 0 $((SHARDS - 1))); do echo "$s:$PHASE"; done; done | paste -sd,)
RUN_SECS=$((2 * SHARDS * ${PHASE%s}))
CSV="$OUT/hotspot.csv"
echo "setup,round,tasks,shard,replicas_max,ops_per_sec,failed_ops,read_batches,read_mean_us,read_p99_us,write_batches,write_mean_us,write_p99_us,kvd_cpu_percent,check,copies_per_key" >"$CSV"

for round in $(seq 1 "$ROUNDS"); do
  for setup in $SETUPS; do
    first=1
    base=${setup%-stale}
    READS=(--reads replicas)
    [[ $setup == *-stale ]] && READS=(--reads stale --max-staleness 500ms)
    for tasks in $TASKS; do
      say "round $round, $setup, $tasks tasks: starting $SHARDS shards on hosts of $CPU cores"
      rm -rf "$WORK/data" "$WORK"/kvd-*.log
      for s in $(seq 0 $((SHARDS - 1))); do kvd_on "$s" 0 "$s" --group "$(addr "$s")"; done
      wait_up $(for s in $(seq 0 $((SHARDS - 1))); do addr "$s"; done)
      on "$CLIENT" "$BIN/kvd" admin init-group --nodes "$NODES" "${AUTH[@]}" >/dev/null
      SPARES=()
      max=1
      RUN_NODES=$NODES
      case $base in
        manager-slots)
          for e in $(seq 0 $((EXTRA - 1))); do
            g=$((SHARDS + e))
            (spawn "$g" "$BIN/kvd" --shard "$g/$((g + 1))" --no-slots --listen "$(addr "$g")" \
              --data-dir "$WORK/data/h$g-s$g" --snapshot-every "$SNAPSHOT_EVERY" --group "$(addr "$g")" "${AUTH[@]}" >>"$WORK/kvd-h$g.log" 2>&1) &
            PIDS+=($!)
            RUN_NODES="$RUN_NODES,$(addr "$g")"
          done
          wait_up $(for e in $(seq 0 $((EXTRA - 1))); do addr $((SHARDS + e)); done)
          on "$CLIENT" "$BIN/kvd" admin init-group --nodes "${RUN_NODES#"$NODES",}" "${AUTH[@]}" >/dev/null
          ;;
        fixedR)
          for e in $(seq 0 $((EXTRA - 1))); do
            h=$((SHARDS + e)); s=$((e % SHARDS))
            kvd_on "$h" 0 "$s" --join
            wait_up "$(addr "$h")"
          done
          max=$((1 + (EXTRA + SHARDS - 1) / SHARDS))
          ;;
        fixedRall | manager)
          for e in $(seq 0 $((EXTRA - 1))); do
            h=$((SHARDS + e))
            for s in $(seq 0 $((SHARDS - 1))); do
              kvd_on "$h" "$s" "$s" --join
              SPARES+=("$(addr "$h" "$s")")
            done
          done
          wait_up "${SPARES[@]}"
          max=$((1 + EXTRA))
          ;;
      esac
      on "$CLIENT" "$BIN/kvbench" load --quiet --nodes "$NODES" --records "$RECORDS" "${AUTH[@]}" >/dev/null
      if [[ $base == fixedR ]]; then
        # Added once the data is in, and caught up before the run (add-replica waits).
        for e in $(seq 0 $((EXTRA - 1))); do
          h=$((SHARDS + e)); s=$((e % SHARDS))
          on "$CLIENT" "$BIN/kvd" admin add-replica --learner --nodes "$(addr "$s")" "${AUTH[@]}" "$(addr "$h")" \
            >>"$WORK/admin.log" 2>&1
        done
      fi
      if [[ $base == fixedRall ]]; then
        # A learner of every shard on every extra host (the most the spares allow).
        for e in $(seq 0 $((EXTRA - 1))); do
          for s in $(seq 0 $((SHARDS - 1))); do
            on "$CLIENT" "$BIN/kvd" admin add-replica --learner --nodes "$(addr "$s")" "${AUTH[@]}" \
              "$(addr $((SHARDS + e)) "$s")" >>"$WORK/admin.log" 2>&1
          done
        done
      fi
      if [[ $base == manager-slots ]]; then
        (spawn "$CLIENT" "$BIN/kvd" manager --nodes "$RUN_NODES" --move-slots --spread-above "$SPREAD_ABOVE" --chunk 1024 \
          --interval "${INTERVAL_MS}ms" --up-after "$UP_AFTER" --settle $((1000 / INTERVAL_MS)) \
          --balance-after $((2000 / INTERVAL_MS)) --duration "$((RUN_SECS + 120))s" "${AUTH[@]}" \
          >"$OUT/$setup-t$tasks.log" 2>&1) &
        PIDS+=($!)
      fi
      if [[ $base == manager ]]; then
        (spawn "$CLIENT" "$BIN/kvd" manager --nodes "$NODES" --spare "$(IFS=,; echo "${SPARES[*]}")" \
          --max-replicas "$max" --hot-reads 60000 --interval 1s --up-after 2 --down-after 3 --settle 1 \
          --duration "$((RUN_SECS + 120))s" "${AUTH[@]}" >"$OUT/$setup-t$tasks.log" 2>&1) &
        PIDS+=($!)
      fi
      stem="$OUT/$setup-t$tasks"
      on "$CLIENT" "$BIN/kvbench" run --quiet --nodes "$RUN_NODES" --records "$RECORDS" -w hotkey \
        --phases "$PHASES" --hot-ops "$HOT_OPS" --split-reads "${READS[@]}" --tasks "$tasks" --warmup 0s \
        --duration "${RUN_SECS}s" --json "$stem.json" --timeline "$stem-timeline" --allow-failures "${AUTH[@]}" >/dev/null
      verdict=""
      if [[ ($base == manager || $base == manager-slots) && -n $CHECK && $first == 1 ]]; then
        # Not in the measured run: a second, shorter run of the same load with a recorded
        # history beside it, while the manager works. With --reads stale the check holds
        # the reads to the stated bound instead of linearizability (kvbench check).
        say "checking the history for $CHECK while the manager works"
        held=linearizable broken=NOT-linearizable
        if [[ $setup == *-stale ]]; then held=within-bound broken=staler-than-bound; fi
        (spawn "$CLIENT" "$BIN/kvbench" run --quiet --nodes "$RUN_NODES" --records "$RECORDS" -w hotkey \
          --phases "$PHASES" --hot-ops "$HOT_OPS" --split-reads "${READS[@]}" --tasks "$tasks" --warmup 0s \
          --duration "$CHECK" "${AUTH[@]}" >/dev/null 2>&1) &
        load_pid=$!
        if on "$CLIENT" "$BIN/kvbench" check --nodes "$RUN_NODES" --duration "$CHECK" "${READS[@]}" "${AUTH[@]}" \
          >"$OUT/check-$setup.txt" 2>&1; then
          verdict=$held
        else
          verdict=$broken
        fi
        wait "$load_pid" || true
        cat "$OUT/check-$setup.txt" >&2
        grep -E " (add|remove|added|removed|move|moved) " "$OUT/$setup-t$tasks.log" | tail -4 >&2 || true
      fi
      python3 - "$stem.json" "$setup" "$round" "$tasks" "$max" "$verdict" "$stem.log" "$SHARDS" "$RUN_SECS" >>"$CSV" <<'PY'
import json, os, re, sys
from datetime import datetime, timezone
d = json.load(open(sys.argv[1]))
setup, rnd, tasks, mx, verdict, log = sys.argv[2:8]
shards, secs = int(sys.argv[8]), float(sys.argv[9])
# Copies of each key, averaged over the run (replica-seconds over fixed1's): fixed set-ups
# hold theirs throughout; the manager's learners count from its "add" to its "removed";
# moved slots keep one copy.
copies = float(mx)
if setup.startswith("manager") and os.path.exists(log):
    start = d["started_unix_ms"] / 1000
    extra, since = 0.0, {}
    for line in open(log):
        m = re.match(r"(\S+Z) shard (\d+) (add|removed) (\S+):", line)
        if not m:
            continue
        t = datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
        t = min(max(t - start, 0.0), secs)
        key = (m[2], m[4])
        if m[3] == "add":
            since[key] = t
        elif key in since:
            extra += t - since.pop(key)
    extra += sum(secs - t for t in since.values())
    copies = 1 + extra / (shards * secs)
for i, n in enumerate(d["per_node"]):
    r, w = n.get("read_batches_us") or {}, n.get("write_batches_us") or {}
    f = lambda h, k: "" if h.get(k) is None else f"{h[k]:.0f}"
    print(",".join([setup, rnd, tasks, str(i), mx, f"{d['ops_per_sec']:.0f}", str(d["failed_ops"]),
                    str(r.get("count", 0)), f(r, "mean_us"), f(r, "p99_us"),
                    str(w.get("count", 0)), f(w, "mean_us"), f(w, "p99_us"),
                    f"{n['server']['cpu_percent']:.0f}", verdict, f"{copies:.2f}"]))
PY
      tail -n "$SHARDS" "$CSV" >&2
      stop_all
      if [[ -n ${KEEP_LOGS:-} ]]; then
        mkdir -p "$stem-kvd-logs" && cp "$WORK"/kvd-*.log "$stem-kvd-logs/" 2>/dev/null || true
      fi
      first=0
    done
  done
done
say "writing $OUT/hotspot.png"
python3 -c 'import matplotlib' 2>/dev/null || pip install --quiet matplotlib >&2
python3 - "$CSV" "$OUT" <<'PY'
import csv, sys, statistics
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = list(csv.DictReader(open(sys.argv[1])))
setups = list(dict.fromkeys(r["setup"] for r in rows))
tasks = sorted({int(r["tasks"]) for r in rows})
fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
width = 0.8 / len(setups)
for k, s in enumerate(setups):
    p99, ops = [], []
    for t in tasks:
        sel = [r for r in rows if r["setup"] == s and int(r["tasks"]) == t]
        # Every shard is hot in turn: the worst shard's read p99 is the hot spot's.
        p99.append(statistics.median([max(float(r["read_p99_us"] or 0) for r in sel if r["round"] == rd)
                                      for rd in {r["round"] for r in sel}]) / 1000 if sel else 0)
        ops.append(statistics.median([float(r["ops_per_sec"]) for r in sel]) / 1e3 if sel else 0)
    xs = [i + k * width for i in range(len(tasks))]
    a1.bar(xs, p99, width, label=s)
    a2.bar(xs, ops, width, label=s)
for a, t in ((a1, "worst shard's read p99 (ms)"), (a2, "throughput (thousand op/s)")):
    a.set_xticks([i + width * (len(setups) - 1) / 2 for i in range(len(tasks))], [f"{t} tasks" for t in tasks])
    a.set_ylabel(t)
    a.grid(alpha=0.3, axis="y")
a1.legend()
fig.suptitle("Moving hot spot on capped hosts: one replica, fixed replicas, shard manager")
fig.tight_layout()
for ext in ("png", "svg"):
    fig.savefig(f"{sys.argv[2]}/hotspot.{ext}", dpi=110)
PY
say "writing $OUT/placement.png (where the manager put replicas and slots, against the hot spot)"
python3 - "$OUT" "$SHARDS" "$PHASE" "$RUN_SECS" "$TASKS" <<'PY'
import glob, json, os, re, sys
from datetime import datetime, timezone
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out, shards, phase, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3].rstrip("s")), int(sys.argv[4])
tasks = sys.argv[5].split()[0]
runs = [s for s in ("manager", "manager-slots") if os.path.exists(f"{out}/{s}-t{tasks}.log")]
if not runs:
    sys.exit(0)
fig, axes = plt.subplots(len(runs), 1, figsize=(10, 3.2 * len(runs)), squeeze=False)
stamp = lambda t: datetime.strptime(t, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
for ax, setup in zip(axes[:, 0], runs):
    start = json.load(open(f"{out}/{setup}-t{tasks}.json"))["started_unix_ms"] / 1000
    for k in range(secs // phase):
        ax.axvspan(k * phase, (k + 1) * phase, color=f"C{k % shards}", alpha=0.08)
        ax.text(k * phase + 0.5, 0.97, f"hot: shard {k % shards}", transform=ax.get_xaxis_transform(), va="top", fontsize=8)
    if setup == "manager":
        # Members per shard: 1, plus learners from "added" to "removed".
        counts = {g: [(0.0, 1)] for g in range(shards)}
        for line in open(f"{out}/{setup}-t{tasks}.log"):
            m = re.match(r"(\S+Z) shard (\d+) (added|removed) ", line)
            if m:
                g, t = int(m[2]), stamp(m[1]) - start
                counts[g].append((t, counts[g][-1][1] + (1 if m[3] == "added" else -1)))
        ylabel = "members per shard"
    else:
        # Slots per group, from the even split of the first groups.
        n = max(int(x) for x in re.findall(r"group (\d+)", open(f"{out}/{setup}-t{tasks}.log").read())) + 1
        counts = {g: [(0.0, 16384 // shards + (g < 16384 % shards) if g < shards else 0)] for g in range(n)}
        for line in open(f"{out}/{setup}-t{tasks}.log"):
            m = re.match(r"(\S+Z) shard (\d+) moved group (\d+): (\d+) slots", line)
            if m:
                t, a, b, k = stamp(m[1]) - start, int(m[2]), int(m[3]), int(m[4])
                counts[a].append((t, counts[a][-1][1] - k))
                counts[b].append((t, counts[b][-1][1] + k))
        ylabel = "slots per group"
    for g, steps in counts.items():
        steps = steps + [(secs, steps[-1][1])]
        ax.step([t for t, _ in steps], [c for _, c in steps], where="post", label=f"{'shard' if setup == 'manager' else 'group'} {g}")
    ax.set_xlim(0, secs)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{setup}, {tasks} tasks")
    ax.legend(fontsize=7, ncol=6, loc="lower right")
    ax.grid(alpha=0.3)
axes[-1, 0].set_xlabel("seconds into the run")
fig.tight_layout()
for ext in ("png", "svg"):
    fig.savefig(f"{out}/placement.{ext}", dpi=110)
PY
say "done: $CSV"
