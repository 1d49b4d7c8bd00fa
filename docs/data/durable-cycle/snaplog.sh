#!/bin/bash
# snaplog.sh BIN: durable kvd, 1M records, YCSB-A batch 64; samples the log every 0.5 s for 10 s,
# kill -9 of kvd under load, then times its restart (until `kvd stats` answers) and its replay.
B=$1; P=17968; D=$(mktemp -d)
$B/kvd --listen 127.0.0.1:$P --capacity 1000000 --data-dir $D --fsync always >/dev/null 2>&1 & K=$!
sleep 1.5; $B/kvbench load --nodes 127.0.0.1:$P --quiet >/dev/null
$B/kvbench run --nodes 127.0.0.1:$P -w a --batch 64 --warmup 1s --duration 14s --quiet >/dev/null 2>&1 & R=$!
q() { $B/kvd stats --nodes 127.0.0.1:$P --timeout 1s --json 2>/dev/null | python3 -c 'import json,sys; x=json.load(sys.stdin)[0]["stats"]["durability"]; print(x["log_bytes"], x["log_entries"], x["last_applied"]-x["snapshot_index"])' 2>/dev/null; }
maxb=0; maxe=0; for i in $(seq 1 20); do sleep 0.5; set -- $(q); [ -n "$1" ] && { [ $1 -gt $maxb ] && maxb=$1; [ $3 -gt $maxe ] && maxe=$3; }; done
set -- $(q); kill -9 $K; wait $K 2>/dev/null; kill $R 2>/dev/null; wait $R 2>/dev/null
t0=$(date +%s.%N); $B/kvd --listen 127.0.0.1:$P --capacity 1000000 --data-dir $D --fsync always >/dev/null 2>&1 & K=$!
until $B/kvd stats --nodes 127.0.0.1:$P --timeout 1s >/dev/null 2>&1; do sleep 0.05; done; t1=$(date +%s.%N)
echo "max log on disk $((maxb/1048576)) MiB, max entries past the snapshot $maxe; at the kill: $(($1/1048576)) MiB, $3 entries past it; restart $(python3 -c "print(round($t1-$t0,2))") s"
kill $K; wait $K 2>/dev/null; rm -rf $D
