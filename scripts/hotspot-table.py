#!/usr/bin/env python3
"""Markdown rows of docs/BENCHMARKS.md's hot-spot tables from hotspot-bench.sh's CSV.

usage: scripts/hotspot-table.py OUT/hotspot.csv

One row per run (round, set-up, task count). Ratios are against the fixed set-ups of the
same round, task count and read mode (a -stale set-up against the -stale fixed ones):
op/s against the highest fixed op/s, the worst group's read p99 against the lowest fixed
worst-group read p99.
"""
import collections
import csv
import sys


def figures(rows):
    p99 = [int(r["read_p99_us"] or 0) / 1000 for r in rows]
    mean = max(int(r["read_mean_us"] or 0) for r in rows) / 1000
    write = max(int(r["write_p99_us"] or 0) for r in rows) / 1000
    return float(rows[0]["ops_per_sec"]), max(p99), min(p99), mean, write


def main(path):
    runs = collections.OrderedDict()
    with open(path) as f:
        for r in csv.DictReader(f):
            runs.setdefault((r["round"], r["tasks"], r["setup"]), []).append(r)
    fixed = collections.defaultdict(list)
    for (rnd, tasks, setup), rows in runs.items():
        if setup.startswith("fixed"):
            fixed[(rnd, tasks, setup.endswith("-stale"))].append(figures(rows))
    for (rnd, tasks, setup), rows in runs.items():
        peers = fixed.get((rnd, tasks, setup.endswith("-stale")))
        if not peers:
            sys.exit(f"{path}: no fixed set-up beside {setup} (round {rnd}, {tasks} tasks)")
        best_ops = max(p[0] for p in peers)
        best_p99 = min(p[1] for p in peers)
        ops, worst, best, mean, write = figures(rows)
        print(f"| {rnd} | {setup} | {tasks} | {ops:,.0f} | {ops / best_ops:.2f} | {mean:.1f} ms "
              f"| {worst:.1f} / {best:.1f} ms | {worst / best_p99:.2f} | {write:.1f} ms "
              f"| {rows[0]['copies_per_key']} | {rows[0]['failed_ops']} | {rows[0]['check'] or '-'} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
