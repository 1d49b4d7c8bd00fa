#!/usr/bin/env bash
# usage: ab-dur.sh OUTDIR ROUNDS binA binB [extra durability-bench args]
out=$1; rounds=$2; a=$3; b=$4; shift 4
mkdir -p $out
cd "$(git rev-parse --show-toplevel)"; BINS=${BINS:-/work/bins}  # one directory per build, each with kvd and kvbench
for r in $(seq 1 $rounds); do
  for x in $a $b; do
    echo "== round $r $x" | tee -a $out/all.txt
    python3 scripts/durability-bench.py --bin-dir $BINS/$x --out $out/$x-$r --rounds 1 "$@" 2>&1 | grep "^round" | tee -a $out/all.txt
  done
done
