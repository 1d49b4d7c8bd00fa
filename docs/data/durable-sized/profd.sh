#!/bin/bash
# profd.sh BIN OUT: durable (--fsync always) kvd under YCSB-A batch 64, perf record kvd 6 s
B=$1; OUT=$2; P=17965; D=$(mktemp -d /work/pd.XXXX)
$B/kvd --listen 127.0.0.1:$P --capacity 1000000 --data-dir $D --fsync always >/dev/null 2>&1 & K=$!
sleep 1.5; $B/kvbench load --nodes 127.0.0.1:$P --quiet >/dev/null
$B/kvbench run --nodes 127.0.0.1:$P -w a --batch 64 --warmup 2s --duration 10s --quiet > /tmp/r5/profd-run.txt 2>&1 & R=$!
sleep 4; perf record -F 499 --call-graph dwarf,16384 -p $K -o $OUT -- sleep 6 >/dev/null 2>&1
wait $R; echo "$B: $(grep throughput /tmp/r5/profd-run.txt)"
kill $K; wait $K 2>/dev/null; rm -rf $D
