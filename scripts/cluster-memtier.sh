#!/usr/bin/env bash
# memtier_benchmark --cluster-mode against a kvd cluster of Redis Cluster nodes: SHARDS kvd
# processes (in memory) with --resp-cluster, memtier given one of them; it learns the slots
# with CLUSTER SLOTS and sends each request to its slot's node. Prints memtier's totals and
# the nodes' `moved` counters; exits 1 when memtier fails or any request was redirected
# (a client that knows the slots never is). Builds memtier with scripts/build-memtier.sh.
#
#   scripts/cluster-memtier.sh                     # 3 shards, 10 s, YCSB-B-like 1:19
#   SHARDS=2 TEST_TIME=5 scripts/cluster-memtier.sh
#
# Environment: SHARDS (3), TEST_TIME (10), PORT (17300: binary ports PORT.., RESP ports
# PORT+100..), MEMTIER_ARGS (extra arguments), MEMTIER_REPO (see build-memtier.sh). Starts only its own kvd processes and stops
# them by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARDS=${SHARDS:-3}
TEST_TIME=${TEST_TIME:-10}
PORT=${PORT:-17300}
memtier=$(scripts/build-memtier.sh)
cargo build --release --quiet -p kvd
KVD=target/release/kvd

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
nodes=$(for ((i = 0; i < SHARDS; i++)); do printf '127.0.0.1:%d,' $((PORT + i)); done)
nodes=${nodes%,}
for ((i = 0; i < SHARDS; i++)); do
  "$KVD" --shard "$i/$SHARDS" --listen "127.0.0.1:$((PORT + i))" --resp "127.0.0.1:$((PORT + 100 + i))" \
    --nodes "$nodes" --resp-cluster 2>/dev/null &
  pids+=($!)
done
for _ in $(seq 50); do
  redis-cli -p $((PORT + 100)) cluster info 2>/dev/null | grep -q cluster_state:ok && break
  sleep 0.2
done
# shellcheck disable=SC2086
"$memtier" -s 127.0.0.1 -p $((PORT + 100)) --cluster-mode --ratio=1:19 -d 128 --pipeline=16 -c 10 -t 2 \
  --key-maximum=1000000 --test-time="$TEST_TIME" --hide-histogram ${MEMTIER_ARGS:-} 2>/dev/null | sed -n '/ALL STATS/,$p'
moved=$("$KVD" stats --json --nodes "$nodes" | grep -o '"moved": [0-9]*' | awk '{s += $2} END {print s + 0}')
echo "redirects (-MOVED) answered by the nodes: $moved"
[[ $moved -eq 0 ]]
