#!/usr/bin/env bash
# kvd next to Redis on this machine: the same 1,000,000 records of 128 bytes in both, Redis
# measured with redis-benchmark (GET and SET, pipelined), kvd with kvbench's course YCSB-B,
# alternating A B A B so that a noisy machine hurts both alike. Prints every figure and the
# ratio kvd / Redis, where Redis's YCSB-B equivalent is 1 / (0.95/GET + 0.05/SET).
#
#   scripts/bench-vs-redis.sh                      # 3 rounds
#   ROUNDS=5 scripts/bench-vs-redis.sh
#
# Environment: ROUNDS (3), RECORDS (1000000), REDIS_PORT (16379), KVD_PORT (17079),
# REDIS_ARGS (-c 50 -P 128 -n 2000000), KVBENCH_ARGS (--tasks 50 --batch 128 --duration 10s),
# KVD_ARGS (none). Starts only its own redis-server and kvd, and stops them by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
RECORDS=${RECORDS:-1000000}
REDIS_PORT=${REDIS_PORT:-16379}
KVD_PORT=${KVD_PORT:-17079}
REDIS_ARGS=${REDIS_ARGS:--c 50 -P 128 -n 2000000}
KVBENCH_ARGS=${KVBENCH_ARGS:---tasks 50 --batch 128 --duration 10s}
KVD_ARGS=${KVD_ARGS:-}

if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
  echo "== installing redis (Debian redis-server, redis-tools)"
  if [[ $(id -u) -ne 0 ]]; then echo "redis is missing and installing it needs root" >&2; exit 2; fi
  apt-get update -qq && apt-get install -y -qq redis-server redis-tools >/dev/null
fi

echo "== building kvd and kvbench (release)"
cargo build --release --quiet -p kvd -p kvbench
KVD=target/release/kvd
KVBENCH=target/release/kvbench

pids=()
cleanup() {
  for pid in "${pids[@]+"${pids[@]}"}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]+"${pids[@]}"}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no >/tmp/bench-vs-redis-redis.log 2>&1 &
pids+=("$!")
# shellcheck disable=SC2086 # KVD_ARGS is a list of words
"$KVD" --listen "127.0.0.1:$KVD_PORT" --capacity "$RECORDS" $KVD_ARGS 2>/tmp/bench-vs-redis-kvd.log &
pids+=("$!")
export KV_NODES="127.0.0.1:$KVD_PORT"
for _ in $(seq 1 100); do
  redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && "$KVD" stats >/dev/null 2>&1 && break
  sleep 0.1
done

echo "== loading $RECORDS records of 128 B into both"
# redis-benchmark's keys are key:NNNNNNNNNNNN (12 digits, uniform over -r), so Redis gets
# those names; kvd gets the course's decimal keys. Same count, same value size.
awk -v n="$RECORDS" 'BEGIN {
  v = sprintf("%0128d", 0)
  for (i = 0; i < n; i++) { k = sprintf("key:%012d", i); printf "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$128\r\n%s\r\n", length(k), k, v }
}' | redis-cli -p "$REDIS_PORT" --pipe | tail -1
"$KVBENCH" load --quiet --records "$RECORDS"
echo "redis keys: $(redis-cli -p "$REDIS_PORT" dbsize)"

redis_rps() { # TEST -> requests per second
  # shellcheck disable=SC2086 # REDIS_ARGS is a list of words
  redis-benchmark -p "$REDIS_PORT" -t "$1" -r "$RECORDS" -d 128 $REDIS_ARGS -q 2>/dev/null |
    tr '\r' '\n' | awk -F'[: ]+' '/requests per second/ {print $2}' | tail -1
}

printf '\n%-6s %14s %14s %16s %16s %8s\n' round "redis GET/s" "redis SET/s" "redis YCSB-B*/s" "kvd YCSB-B op/s" "kvd/redis"
sum_ratio=0
for ((r = 1; r <= ROUNDS; r++)); do
  get=$(redis_rps get)
  set=$(redis_rps set)
  redis_b=$(awk -v g="$get" -v s="$set" 'BEGIN { printf "%.0f", 1 / (0.95 / g + 0.05 / s) }')
  # shellcheck disable=SC2086 # KVBENCH_ARGS is a list of words
  kvd_b=$("$KVBENCH" run --quiet --records "$RECORDS" $KVBENCH_ARGS --json - 2>/dev/null |
    awk -F': ' '/"ops_per_sec"/ {gsub(",", "", $2); print int($2); exit}')
  ratio=$(awk -v k="$kvd_b" -v r="$redis_b" 'BEGIN { printf "%.2f", k / r }')
  sum_ratio=$(awk -v a="$sum_ratio" -v b="$ratio" 'BEGIN { print a + b }')
  printf '%-6s %14.0f %14.0f %16s %16s %8s\n' "$r" "$get" "$set" "$redis_b" "$kvd_b" "$ratio"
done
echo
echo "mean kvd/redis: $(awk -v s="$sum_ratio" -v n="$ROUNDS" 'BEGIN { printf "%.2f", s / n }')"
echo "* Redis YCSB-B equivalent = 1 / (0.95/GET + 0.05/SET); redis-benchmark keys are uniform, kvbench's zipfian 0.99."
echo "  redis-benchmark $REDIS_ARGS -d 128 -r $RECORDS;  kvbench run $KVBENCH_ARGS (YCSB-B, $RECORDS records)"
