#!/usr/bin/env python3
"""What durability costs: in memory vs --fsync never / 1s / always, A B A B in one session.

For each round, workload and batch size, runs every mode once (so the modes alternate and a
noisy minute hurts them alike): a fresh kvd (a fresh data dir for the durable modes), `kvbench
load` (1,000,000 records of 128 B), `kvd stats --json`, `kvbench run` (zipfian 0.99, 2 s
warm-up), `kvd stats --json` again. Writes one CSV row per run and prints a table of medians:
op/s, kvd and kvbench CPU, update p50/p99, fsyncs per second and updates per fsync.

`--stall` measures instead what snapshots cost while serving: YCSB-A under --fsync always,
snapshots on (default --snapshot-every) vs off (a count of entries the run never reaches),
reporting the per-second throughput's minimum and median and the snapshots taken.

`--restart` measures how long a durable kvd takes to come back: 1,000,000 records loaded under
--fsync always, a snapshot taken, then the node stopped and started `--rounds` times over the
same data dir; each restart is timed from spawn until `kvd stats` answers (kvd listens once
recovery is done) and its key count is checked.

Talks only to 127.0.0.1; stops each kvd it started, by PID; every run is bounded by
--duration. Needs the release binaries (cargo build --release).
"""

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

MODES = ["memory", "never", "1s", "always"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2, help="A B A B rounds (default 2)")
    p.add_argument("--duration", default="8s", help="measured time per run (default 8s)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated, from memory,never,1s,always")
    p.add_argument("--workloads", default="b,a", help="YCSB workloads (default b,a)")
    p.add_argument("--batches", default="64,1024", help="batch sizes (default 64,1024)")
    p.add_argument("--port", type=int, default=17950)
    p.add_argument("--bin-dir", default="target/release", help="where kvd and kvbench are")
    p.add_argument("--data-root", default=None, help="where the data dirs go (default: a temp dir)")
    p.add_argument("--out", default="target/durability-bench", help="directory for runs.csv")
    p.add_argument("--stall", action="store_true", help="measure the snapshot stall instead")
    p.add_argument("--restart", action="store_true", help="time restarts from a snapshot instead")
    return p.parse_args()


class Kvd:
    """One kvd we started; stopped by PID."""

    def __init__(self, args, bin_dir, port, extra):
        self.addr = f"127.0.0.1:{port}"
        self.bin_dir = bin_dir
        self.proc = subprocess.Popen(
            [f"{bin_dir}/kvd", "--listen", self.addr, "--capacity", "1000000", *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 30
        while self.stats() is None:
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"kvd {' '.join(extra)} did not start")
            time.sleep(0.1)

    def stats(self):
        out = subprocess.run(
            [f"{self.bin_dir}/kvd", "stats", "--nodes", self.addr, "--json", "--timeout", "2s"],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            return None
        return json.loads(out.stdout)[0]["stats"]

    def peak_rss_mb(self):
        """The process's peak resident memory so far (VmHWM), in MB."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024)
        return 0

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def load(bin_dir, addr):
    subprocess.run(
        [f"{bin_dir}/kvbench", "load", "--nodes", addr, "--quiet"],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def kvbench(bin_dir, verb, addr, *extra):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run(
            [f"{bin_dir}/kvbench", verb, "--nodes", addr, "--quiet", "--json", f.name, *extra],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return json.load(open(f.name))


def one_run(a, data_root, label, kvd_args, workload, batch):
    data = os.path.join(data_root, label)
    shutil.rmtree(data, ignore_errors=True)
    extra = [arg.replace("{data}", data) for arg in kvd_args]
    kvd = Kvd(a, a.bin_dir, a.port, extra)
    try:
        load(a.bin_dir, kvd.addr)
        before = kvd.stats()
        t0 = time.time()
        run = kvbench(
            a.bin_dir, "run", kvd.addr, "-w", workload, "--batch", str(batch), "--warmup", "2s", "--duration", a.duration
        )
        wall = time.time() - t0
        after = kvd.stats()
        peak_rss_mb = kvd.peak_rss_mb()
    finally:
        kvd.stop()
        shutil.rmtree(data, ignore_errors=True)
    d0, d1 = before["durability"], after["durability"]
    fsyncs = d1["fsyncs"] - d0["fsyncs"]
    puts = after["puts"] - before["puts"]
    lat = run["latency_us"]
    upd = lat.get("update", {})
    per_second = run.get("per_second") or [0]
    return {
        "label": label,
        "workload": workload,
        "batch": batch,
        "ops_per_sec": round(run["ops_per_sec"]),
        "kvd_cpu_percent": round(run["per_node"][0]["server"]["cpu_percent"]),
        "kvbench_cpu_percent": round(run.get("client_cpu_percent") or 0),
        "read_p50_us": round(lat.get("read", {}).get("p50_us", 0)),
        "update_p50_us": round(upd.get("p50_us", 0)),
        "update_p99_us": round(upd.get("p99_us", 0)),
        "fsyncs_per_sec": round(fsyncs / wall, 1),
        "updates_per_fsync": round(puts / fsyncs, 1) if fsyncs else "",
        "fsync_mean_us": fsync_mean_us(d0, d1),
        "snapshots": d1["snapshots_taken"] - d0["snapshots_taken"],
        "min_per_second": min(per_second),
        "median_per_second": round(statistics.median(per_second)),
        "failed_ops": run["failed_ops"],
        "peak_rss_mb": peak_rss_mb,
        "log_memory_mb": round(d1.get("log_memory_bytes", 0) / 2**20, 1),
    }


def fsync_mean_us(d0, d1):
    """The mean fsync time between two samples (the histogram's sum over its count)."""
    def totals(d):
        f = d.get("fsync") or {"buckets": [], "sum_ns": 0}
        return sum(c for _, c in f["buckets"]), f["sum_ns"]

    (n0, s0), (n1, s1) = totals(d0), totals(d1)
    return round((s1 - s0) / (n1 - n0) / 1000) if n1 > n0 else ""


def restarts(a, data_root):
    """Loads a durable node, waits for its snapshot, then times `a.rounds` restarts."""
    data = os.path.join(data_root, "restart")
    shutil.rmtree(data, ignore_errors=True)
    args = [arg.replace("{data}", data) for arg in durable_args("always")]
    kvd = Kvd(a, a.bin_dir, a.port, args)
    try:
        load(a.bin_dir, kvd.addr)
        deadline = time.time() + 60
        while (kvd.stats() or {}).get("durability", {}).get("snapshots_taken", 0) < 1:
            if time.time() > deadline:
                raise SystemExit("no snapshot within 60 s of the load")
            time.sleep(0.5)
        time.sleep(1)
    finally:
        kvd.stop()
    took = []
    for r in range(a.rounds):
        t0 = time.time()
        kvd = Kvd(a, a.bin_dir, a.port, args)
        took.append(time.time() - t0)
        keys = (kvd.stats() or {}).get("keys")
        kvd.stop()
        print(f"restart {r + 1}: serving after {took[-1]:.2f} s with {keys} keys", flush=True)
        if keys != 1_000_000:
            raise SystemExit(f"restart {r + 1} came back with {keys} keys, not 1,000,000")
    shutil.rmtree(data, ignore_errors=True)
    print(f"median restart {statistics.median(took):.2f} s over {a.rounds}")
    return 0


def durable_args(mode):
    if mode == "memory":
        return []
    return ["--data-dir", "{data}", "--fsync", mode]


def main():
    a = parse_args()
    for tool in ("kvd", "kvbench"):
        if not os.access(f"{a.bin_dir}/{tool}", os.X_OK):
            raise SystemExit(f"{a.bin_dir}/{tool} is missing: run cargo build --release first")
    os.makedirs(a.out, exist_ok=True)
    data_root = a.data_root or tempfile.mkdtemp(prefix="kvd-durability-bench-")
    if a.restart:
        try:
            return restarts(a, data_root)
        finally:
            if not a.data_root:
                shutil.rmtree(data_root, ignore_errors=True)
    if a.stall:
        configs = [
            ("snapshots-off", durable_args("always") + ["--snapshot-every", "1000000000entries"]),
            ("snapshots-on", durable_args("always")),
        ]
        grid = [("a", 64)]
    else:
        configs = [(m, durable_args(m)) for m in a.modes.split(",")]
        grid = [(w, int(b)) for w in a.workloads.split(",") for b in a.batches.split(",")]
    rows = []
    path = os.path.join(a.out, "stall.csv" if a.stall else "runs.csv")
    for r in range(a.rounds):
        for workload, batch in grid:
            for label, args in configs:
                row = one_run(a, data_root, label, args, workload, batch)
                row["round"] = r + 1
                rows.append(row)
                print(
                    f"round {r + 1}  {workload} batch {batch:>5}  {label:<14} {row['ops_per_sec']:>10,} op/s  "
                    f"kvd {row['kvd_cpu_percent']}%  update p50 {row['update_p50_us']} us p99 {row['update_p99_us']} us  "
                    f"fsyncs/s {row['fsyncs_per_sec']}  updates/fsync {row['updates_per_fsync']}  "
                    f"snapshots {row['snapshots']}  per-second min {row['min_per_second']:,}  "
                    f"peak RSS {row['peak_rss_mb']} MB  log in memory {row['log_memory_mb']} MB",
                    flush=True,
                )
                with open(path, "w", newline="") as f:
                    w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
                    w.writeheader()
                    w.writerows(rows)
    if not a.data_root:
        shutil.rmtree(data_root, ignore_errors=True)
    print(f"\nmedians over {a.rounds} rounds ({path}):")
    keys = ["ops_per_sec", "kvd_cpu_percent", "update_p50_us", "update_p99_us", "fsyncs_per_sec", "updates_per_fsync", "peak_rss_mb"]
    if a.stall:
        keys = ["ops_per_sec", "min_per_second", "median_per_second", "snapshots", "update_p99_us", "peak_rss_mb"]
    print("| workload | batch | mode | " + " | ".join(keys) + " |")
    print("|---" * (3 + len(keys)) + "|")
    for workload, batch in grid:
        for label, _ in configs:
            mine = [x for x in rows if x["workload"] == workload and x["batch"] == batch and x["label"] == label]
            cells = []
            for k in keys:
                vals = [x[k] for x in mine if x[k] != ""]
                cells.append(f"{statistics.median(vals):,.0f}" if vals else "-")
            print(f"| {workload} | {batch} | {label} | " + " | ".join(cells) + " |")
    failed = sum(x["failed_ops"] for x in rows)
    if failed:
        print(f"warning: {failed} ops failed across the runs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
