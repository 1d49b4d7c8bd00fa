#!/bin/bash
# prof.sh BIN OUT WORKLOAD MODE(memory|always) [graph]: perf record kvd 6 s under kvbench batch 64
B=$1; OUT=$2; W=$3; M=$4; G=$5; P=17965; D=$(mktemp -d)
EXTRA=""; [ "$M" != memory ] && EXTRA="--data-dir $D --fsync $M"
$B/kvd --listen 127.0.0.1:$P --capacity 1000000 $EXTRA >/dev/null 2>&1 & K=$!
sleep 1.5; $B/kvbench load --nodes 127.0.0.1:$P --quiet >/dev/null
$B/kvbench run --nodes 127.0.0.1:$P -w $W --batch 64 --warmup 2s --duration 10s --quiet > $OUT.run.txt 2>&1 & R=$!
sleep 4
if [ -n "$G" ]; then perf record -F 499 --call-graph dwarf,16384 -p $K -o $OUT -- sleep 6 >/dev/null 2>&1
else perf record -F 1999 -g -p $K -o $OUT -- sleep 6 >/dev/null 2>&1; fi
wait $R; echo "$B $W $M: $(grep -i 'throughput\|op/s' $OUT.run.txt | head -2)"
kill $K; wait $K 2>/dev/null; rm -rf $D
