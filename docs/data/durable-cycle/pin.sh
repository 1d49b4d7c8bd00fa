#!/bin/bash
# pin.sh BIN W MODE: kvd on CPU 0, kvbench on CPU 1
B=$1; W=$2; M=$3; P=17970; D=$(mktemp -d)
EXTRA=""; [ "$M" != memory ] && EXTRA="--data-dir $D --fsync $M"
taskset -c 0 $B/kvd --listen 127.0.0.1:$P --capacity 1000000 $EXTRA >/dev/null 2>&1 & K=$!
sleep 1.5; taskset -c 1 $B/kvbench load --nodes 127.0.0.1:$P --quiet >/dev/null
echo "$W $M pinned: $(taskset -c 1 $B/kvbench run --nodes 127.0.0.1:$P -w $W --batch 64 --warmup 2s --duration 8s --quiet 2>&1 | grep -o 'throughput [0-9,]* op/s\|CPU [0-9]*%' | tr '\n' ' ')"
kill $K; wait $K 2>/dev/null; rm -rf $D
