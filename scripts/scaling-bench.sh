#!/usr/bin/env bash
# Does throughput grow with servers? 1x1, 2x2, 4x4 servers x clients on namespace hosts of a
# fixed CPU quota each, so that more hosts mean more CPU, as more machines would.
set -euo pipefail
usage() {
  cat <<'TXT'
Usage: scripts/scaling-bench.sh [--cpu 0.25] [--sizes "1 2 4"] [--rounds 2] [--duration 10s]
                                [--out docs/data/scaling]

For each round and each size S: `scripts/run-cluster.sh --local --cpu F S S "" "--duration D"`
(S kvd hosts, S kvbench hosts, every host capped at F cores; 1,000,000 records of 128 B,
YCSB-B). Writes OUT/scaling.csv (one row per run: size, round, total op/s, per-node op/s and
kvd CPU, kvbench CPU, batch p50/p99) and OUT/scaling.png + .svg (op/s against servers, with
the ideal line from 1x1). Root (network namespaces, cgroups). About 1 minute per run.
TXT
}
CPU=0.25 SIZES="1 2 4" ROUNDS=2 DURATION=10s OUT=docs/data/scaling
while (($#)); do
  case "$1" in
    --cpu) CPU=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
LOGS=$(mktemp -d /tmp/kvd-scaling.XXXXXX)
CSV="$OUT/scaling.csv"
echo "size,round,cpu_per_host,total_ops_per_sec,node_ops_per_sec,node_kvd_cpu_percent,client_cpu_percent,batch_p50_us,batch_p99_us" >"$CSV"
for round in $(seq 1 "$ROUNDS"); do
  for s in $SIZES; do
    echo "scaling: round $round, $s x $s, $CPU cores per host" >&2
    KV_NS_PREFIX=kvs "$ROOT/scripts/run-cluster.sh" --local --cpu "$CPU" --logs "$LOGS" "$s" "$s" "" \
      "--duration $DURATION --warmup 2s" >/dev/null 2>"$LOGS/run.err" || { cat "$LOGS/run.err" >&2; exit 1; }
    python3 - "$LOGS/latest/merged.json" "$s" "$round" "$CPU" >>"$CSV" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
nodes = d["per_node"]
def q(h, p):
    v = h["latency_us"]["batch"].get(p + "_us")
    return "" if v is None else f"{v:.0f}"
print(",".join([sys.argv[2], sys.argv[3], sys.argv[4], f"{d['ops_per_sec']:.0f}",
                " ".join(f"{n['ops_per_sec']:.0f}" for n in nodes),
                " ".join(f"{n['server']['cpu_percent']:.0f}" for n in nodes),
                f"{d['client_cpu_percent']:.0f}", q(d, "p50"), q(d, "p99")]))
PY
    tail -1 "$CSV" >&2
  done
done
rm -rf "$LOGS"
python3 -c 'import matplotlib' 2>/dev/null || pip install --quiet matplotlib >&2
python3 - "$CSV" "$OUT" <<'PY'
import csv, sys, statistics
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = list(csv.DictReader(open(sys.argv[1])))
sizes = sorted({int(r["size"]) for r in rows})
by = {s: [float(r["total_ops_per_sec"]) for r in rows if int(r["size"]) == s] for s in sizes}
med = [statistics.median(by[s]) / 1e6 for s in sizes]
cpu = rows[0]["cpu_per_host"]
fig, ax = plt.subplots(figsize=(7, 4.2))
for s in sizes:
    ax.scatter([s] * len(by[s]), [v / 1e6 for v in by[s]], color="#1f77b4", alpha=0.5, s=18)
ax.plot(sizes, med, marker="o", color="#1f77b4", label="measured (median of rounds)")
ax.plot(sizes, [med[0] * s / sizes[0] for s in sizes], linestyle="--", color="grey", label="linear from 1 x 1")
ax.set_xticks(sizes, [f"{s} x {s}" for s in sizes])
ax.set_xlabel(f"servers x clients, every host capped at {cpu} cores")
ax.set_ylabel("YCSB-B op/s (millions)")
ax.set_title("Throughput against servers, hosts of a fixed CPU quota")
ax.set_ylim(bottom=0)
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout()
for ext in ("png", "svg"):
    fig.savefig(f"{sys.argv[2]}/scaling.{ext}", dpi=110)
PY
echo "scaling: wrote $CSV and $OUT/scaling.png" >&2
