#!/bin/bash
# conc.sh BIN W MODE TASKS CONNS
B=$1; W=$2; M=$3; T=$4; C=$5; P=17968; D=$(mktemp -d)
EXTRA=""; [ "$M" != memory ] && EXTRA="--data-dir $D --fsync $M"
$B/kvd --listen 127.0.0.1:$P --capacity 1000000 $EXTRA >/dev/null 2>&1 & K=$!
sleep 1.5; $B/kvbench load --nodes 127.0.0.1:$P --quiet >/dev/null
echo "$W $M tasks $T conns $C: $($B/kvbench run --nodes 127.0.0.1:$P -w $W --batch 64 --tasks $T --conns $C --warmup 2s --duration 8s --quiet 2>&1 | grep -o 'throughput [0-9,]* op/s\|batch p50 *[0-9.]* [mu]s' | tr '\n' ' ')"
kill $K; wait $K 2>/dev/null; rm -rf $D
