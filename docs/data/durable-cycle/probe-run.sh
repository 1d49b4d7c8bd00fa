#!/bin/bash
B=$1; W=$2; shift 2; P=17967; D=$(mktemp -d)
env $KENV $B/kvd --listen 127.0.0.1:$P --capacity 1000000 --data-dir $D --fsync ${FSYNC:-always} $KARGS 2>${TMPDIR:-/tmp}/probe-err.txt >/dev/null & K=$!
sleep 1.5; $B/kvbench load --nodes 127.0.0.1:$P --quiet >/dev/null
$B/kvbench run --nodes 127.0.0.1:$P -w $W --batch 64 --warmup 2s --duration 6s --quiet "$@" 2>&1 | grep "server:"
kill $K; wait $K 2>/dev/null; rm -rf $D; grep -a PROBE ${TMPDIR:-/tmp}/probe-err.txt | tail -6 | cut -c1-250
