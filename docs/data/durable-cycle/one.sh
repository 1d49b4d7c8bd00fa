#!/bin/bash
# one.sh BIN WORKLOAD [kvd args...]: one durable-bench-like run, prints kvbench's throughput line
B=$1; W=$2; shift 2; P=17966; D=$(mktemp -d)
ARGS="${@//\{data\}/$D}"
$B/kvd --listen 127.0.0.1:$P --capacity 1000000 $ARGS >/dev/null 2>&1 & K=$!
sleep 1.5; $B/kvbench load --nodes 127.0.0.1:$P --quiet >/dev/null
$B/kvbench run --nodes 127.0.0.1:$P -w $W --batch ${BATCH:-64} --warmup 2s --duration ${DUR:-8s} --quiet 2>&1 | grep "server:" | sed "s|^|$B $W $ARGS: |;s|$D|D|g"
kill $K; wait $K 2>/dev/null; rm -rf $D
