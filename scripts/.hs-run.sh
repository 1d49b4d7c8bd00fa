#!/usr/bin/env bash
# (untracked: this session's A B A B of the manager's multi-target moves)
set -u
cd /work/main
O=/tmp/ab31
mkdir -p $O
for r in 1 2; do
  if ((r == 1)); then order="base head"; else order="head base"; fi
  for v in $order; do
    if [[ $v == base ]]; then export KVD_BIN=/work/base-head-target/release; else export KVD_BIN=/work/main/target/release; fi
    scripts/hotspot-bench.sh --tasks 128 --setups manager-slots --out $O/$v-r$r > $O/$v-r$r.out 2>&1
  done
  export KVD_BIN=/work/main/target/release
  scripts/hotspot-bench.sh --tasks 128 --setups fixedR --out $O/fixedR-r$r > $O/fixedR-r$r.out 2>&1
done
echo done > $O/DONE
