#!/bin/bash
# snaptime.sh BIN: durable kvd, 1M records, YCSB-A batch 64 for 12 s; prints each snapshot's last_snapshot_ms as it changes
B=$1; P=17966; D=$(mktemp -d)
$B/kvd --listen 127.0.0.1:$P --capacity 1000000 --data-dir $D --fsync always >/dev/null 2>&1 & K=$!
sleep 1.5; $B/kvbench load --nodes 127.0.0.1:$P --quiet >/dev/null
$B/kvbench run --nodes 127.0.0.1:$P -w a --batch 64 --warmup 1s --duration 12s --quiet >/dev/null 2>&1 & R=$!
seen=""; for i in $(seq 1 26); do sleep 0.5
  v=$($B/kvd stats --nodes 127.0.0.1:$P --json 2>/dev/null | python3 -c 'import json,sys; x=json.load(sys.stdin)[0]["stats"]["durability"]; print(x["snapshots_taken"], x["last_snapshot_ms"], x["snapshot_bytes"])' 2>&1)
  [ "$v" != "$seen" ] && echo "$v"; seen=$v; done
wait $R; kill $K; wait $K 2>/dev/null; rm -rf $D
