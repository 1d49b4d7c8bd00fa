#!/bin/bash
# renice-run.sh BIN W NICE: durable run with the log-writer thread at NICE (needs root)
B=$1; W=$2; N=$3; P=17969; D=$(mktemp -d)
$B/kvd --listen 127.0.0.1:$P --capacity 1000000 --data-dir $D --fsync always 2>${TMPDIR:-/tmp}/renice-err.txt >/dev/null & K=$!
sleep 1.5
for t in /proc/$K/task/*; do [ "$(cat $t/comm)" = log-writer ] && renice -n $N -p $(basename $t) >/dev/null; done
$B/kvbench load --nodes 127.0.0.1:$P --quiet >/dev/null
echo "$W nice $N: $($B/kvbench run --nodes 127.0.0.1:$P -w $W --batch 64 --warmup 2s --duration 8s --quiet 2>&1 | grep -o 'throughput [0-9,]* op/s')  $(grep -a WPROBE ${TMPDIR:-/tmp}/renice-err.txt | tail -1 | cut -c1-110)"
kill $K; wait $K 2>/dev/null; rm -rf $D
