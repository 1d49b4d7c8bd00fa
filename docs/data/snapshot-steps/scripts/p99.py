#!/usr/bin/env python3
"""p99.py [--series] DIR...: per run, the snapshots (from kvd.log) and the per-second p99 batch
round trip (from run.json's node_timeline) in the seconds a snapshot ran and in the others;
--series prints every second instead (`*`: a snapshot ran) and op/s per second."""
import datetime
import json
import re
import sys


def lower(i):
    """The smallest value of latency bucket i in ns (kvshared::latency::lower_ns)."""
    if i == 0:
        return 0
    i -= 1
    msb = 8 + i // 4
    return (1 << msb) + ((i % 4) << (msb - 2))


def load(d):
    j = json.load(open(d + "/run.json"))
    t0 = j["started_unix_ms"] / 1000
    snaps = []
    for line in open(d + "/kvd.log"):
        m = re.search(r"^(\S+)Z .*wrote a snapshot.*took_ms=(\d+)", line)
        if m:
            end = datetime.datetime.fromisoformat(m.group(1)).replace(tzinfo=datetime.timezone.utc).timestamp()
            snaps.append((end - int(m.group(2)) / 1000 - t0, end - t0))
    per = []
    for h in j["node_timeline"][0]:
        n, acc, v = sum(c for _, c in h["buckets"]), 0, 0
        for i, c in h["buckets"]:
            acc += c
            if acc >= 0.99 * n:
                v = lower(i + 1) / 1e6
                break
        per.append(v)
    during = [any(a < k + 1 and e > k for a, e in snaps) for k in range(len(per))]
    return j, snaps, per, during


series = "--series" in sys.argv
for d in [a for a in sys.argv[1:] if a != "--series"]:
    j, snaps, per, during = load(d)
    if series:
        print(d, "snapshots", [(round(a, 2), round(e, 2)) for a, e in snaps if e > 0])
        print(" ".join(f"{k}:{round(v)}{'*' if during[k] else ''}" for k, v in enumerate(per)))
        print(" ".join(f"{k}:{round(v / 1000)}" for k, v in enumerate(j["per_second"])))
        continue
    ins = [v for v, s in zip(per, during) if s]
    outs = sorted(v for v, s in zip(per, during) if not s)
    took = [round((e - a) * 1000) for a, e in snaps if e > 0]
    print(d, "ops/s", round(j["ops_per_sec"]), "snap took", took, "p99 in snap secs", [round(x) for x in ins],
          "others max", round(outs[-1]), "median", round(outs[len(outs) // 2]))
