#!/usr/bin/env bash
# (untracked: this session's A B A B of the manager's moves)
set -u
cd /work/main
O=/tmp/ab31b
mkdir -p $O
declare -A B=([base]=/work/bin-49ba6a9 [mid]=/work/bin-32db9ac [new]=/work/main/target/release)
for r in 1 2; do
  if ((r == 1)); then order="base mid new"; else order="new mid base"; fi
  for v in $order; do
    KVD_BIN=${B[$v]} scripts/hotspot-bench.sh --tasks 128 --setups manager-slots --out $O/$v-r$r > $O/$v-r$r.out 2>&1
  done
  KVD_BIN=${B[new]} scripts/hotspot-bench.sh --tasks 128 --setups fixedR --out $O/fixedR-r$r > $O/fixedR-r$r.out 2>&1
done
echo done > $O/DONE
