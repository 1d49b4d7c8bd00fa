#!/usr/bin/env bash
# 12 hand-overs in a 3-member group on loopback; prints each "paused N ms"
set -u
B=${B:-/work/main/target/release}
R=$(mktemp -d /var/tmp/ho.XXXX)
G=127.0.0.1:17170,127.0.0.1:17171,127.0.0.1:17172
N="127.0.0.1:17170|127.0.0.1:17171|127.0.0.1:17172"
P=()
for i in 0 1 2; do $B/kvd --shard 0/1 --listen 127.0.0.1:1717$i --group $G --data-dir $R/d$i >$R/k$i.log 2>&1 & P+=($!); done
sleep 1
$B/kvd admin init-group --nodes "$N" >/dev/null 2>&1 || $B/kvd admin init-group --nodes "$N"
sleep 2
for k in $(seq 1 12); do
  t=127.0.0.1:1717$((k % 3))
  $B/kvd admin transfer-leader --nodes "$N" $t 2>&1 | grep -oE "paused [0-9]+ ms|leads already|error.*" | head -1
  sleep 0.5
done
kill ${P[@]}; wait; rm -rf $R
