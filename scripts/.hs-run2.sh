#!/usr/bin/env bash
# (untracked: this session's runs at 32 tasks and the check)
set -u
cd /work/main
O=/tmp/ab31c
mkdir -p $O
while [[ ! -e /tmp/ab31b/DONE ]]; do sleep 5; done
KVD_BIN=/work/bin-49ba6a9 scripts/hotspot-bench.sh --tasks 32 --setups manager-slots --out $O/base-t32 > $O/base-t32.out 2>&1
KVD_BIN=/work/main/target/release scripts/hotspot-bench.sh --tasks 32 --setups "fixedR manager-slots" --out $O/new-t32 > $O/new-t32.out 2>&1
KVD_BIN=/work/main/target/release scripts/hotspot-bench.sh --tasks 128 --setups manager-slots --check 20s --out $O/new-check > $O/new-check.out 2>&1
echo done > $O/DONE
