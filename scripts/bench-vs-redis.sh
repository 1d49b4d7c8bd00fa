#!/usr/bin/env bash
# kvd next to Redis with the same tool: redis-benchmark drives Redis and kvd's RESP front
# (kvd --resp) with the same command line, keys, value size, connections and pipeline depth,
# GET and SET at several pipeline depths, alternating A B A B in one session so that a noisy
# machine hurts both alike. Prints every run and a summary of kvd / Redis ratios.
#
#   scripts/bench-vs-redis.sh                 # 2 rounds, pipelines 1 16 128
#   ROUNDS=3 PIPELINES="1 16" scripts/bench-vs-redis.sh
#
# Environment: ROUNDS (2), PIPELINES ("1 16 128"), RECORDS (1000000, preloaded into both as
# key:NNNNNNNNNNNN with 128-byte values), REQUESTS (2000000 per run; 200000 at pipeline 1),
# CLIENTS (50), BENCH_THREADS (2: redis-benchmark's own threads, so the load tool is not the
# limit), REDIS_PORT (16379), KVD_PORT (17079), KVD_RESP_PORT (16380), KVD_ARGS (none).
# Starts only its own redis-server and kvd, and stops them by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-2}
PIPELINES=${PIPELINES:-1 16 128}
RECORDS=${RECORDS:-1000000}
REQUESTS=${REQUESTS:-2000000}
CLIENTS=${CLIENTS:-50}
BENCH_THREADS=${BENCH_THREADS:-2}
REDIS_PORT=${REDIS_PORT:-16379}
KVD_PORT=${KVD_PORT:-17079}
KVD_RESP_PORT=${KVD_RESP_PORT:-16380}
KVD_ARGS=${KVD_ARGS:-}

if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
  echo "== installing redis (Debian redis-server, redis-tools)"
  if [[ $(id -u) -ne 0 ]]; then echo "redis is missing and installing it needs root" >&2; exit 2; fi
  apt-get update -qq && apt-get install -y -qq redis-server redis-tools >/dev/null
fi

echo "== building kvd (release)"
cargo build --release --quiet -p kvd
KVD=target/release/kvd

pids=()
cleanup() {
  for pid in "${pids[@]+"${pids[@]}"}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]+"${pids[@]}"}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no >/tmp/bench-vs-redis-redis.log 2>&1 &
pids+=("$!")
redis_pid=$!
# shellcheck disable=SC2086 # KVD_ARGS is a list of words
"$KVD" --listen "127.0.0.1:$KVD_PORT" --resp "127.0.0.1:$KVD_RESP_PORT" --capacity "$RECORDS" $KVD_ARGS \
  2>/tmp/bench-vs-redis-kvd.log &
pids+=("$!")
kvd_pid=$!
for _ in $(seq 1 100); do
  redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && redis-cli -p "$KVD_RESP_PORT" ping >/dev/null 2>&1 && break
  sleep 0.1
done

echo "== loading $RECORDS records of 128 B into both (redis-cli --pipe)"
for port in "$REDIS_PORT" "$KVD_RESP_PORT"; do
  awk -v n="$RECORDS" 'BEGIN {
    v = sprintf("%0128d", 0)
    for (i = 0; i < n; i++) { k = sprintf("key:%012d", i); printf "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$128\r\n%s\r\n", length(k), k, v }
  }' | redis-cli -p "$port" --pipe | tail -1
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

results=$(mktemp)
run() { # server port pipeline
  local server=$1 port=$2 pipeline=$3 n=$REQUESTS pid t0 t1 start end out
  [ "$pipeline" = 1 ] && n=$((REQUESTS / 10))
  pid=$redis_pid; [ "$server" = kvd ] && pid=$kvd_pid
  local timing tool_cpu
  timing=$(mktemp)
  t0=$(cpu_ticks "$pid"); start=$(date +%s.%N)
  # bash's `time` gives the tool's own CPU (user + system over wall): is the tool the limit?
  out=$( { TIMEFORMAT='%U %S %R'; time redis-benchmark -p "$port" -t get,set -n "$n" -r "$RECORDS" -d 128 \
    -c "$CLIENTS" -P "$pipeline" --threads "$BENCH_THREADS" -q 2>/dev/null; } 2>"$timing")
  out=$(echo "$out" | tr '\r' '\n' | grep -E '^(GET|SET): [0-9]')
  end=$(date +%s.%N); t1=$(cpu_ticks "$pid")
  tool_cpu=$(awk '{ printf "%.0f", 100 * ($1 + $2) / $3 }' "$timing")
  rm -f "$timing"
  local cpu
  cpu=$(awk -v a="$t0" -v b="$t1" -v s="$start" -v e="$end" 'BEGIN { printf "%.0f", (b - a) / (e - s) }')
  while read -r line; do
    local cmd rps p50
    cmd=${line%%:*}
    rps=$(echo "$line" | awk '{print $2}')
    p50=$(echo "$line" | grep -o 'p50=[0-9.]*' | cut -d= -f2)
    printf '%-5s P=%-4s %-3s %12.0f req/s  p50 %s ms  (%s CPU %s%%, redis-benchmark CPU %s%%, over GET+SET)\n' \
      "$server" "$pipeline" "$cmd" "$rps" "$p50" "$server" "$cpu" "$tool_cpu"
    echo "$server $pipeline $cmd $rps $p50 $cpu $tool_cpu" >>"$results"
  done <<<"$out"
}

echo "== redis-benchmark -t get,set -d 128 -r $RECORDS -c $CLIENTS --threads $BENCH_THREADS, A B A B"
for round in $(seq 1 "$ROUNDS"); do
  echo "-- round $round"
  for pipeline in $PIPELINES; do
    run redis "$REDIS_PORT" "$pipeline"
    run kvd "$KVD_RESP_PORT" "$pipeline"
  done
done

echo
echo "== summary (mean over rounds; CPU is the server's, percent of one core)"
printf '%-6s %-4s %14s %14s %8s %10s %10s %12s %12s\n' pipeline cmd "redis req/s" "kvd req/s" "kvd/redis" \
  "redis CPU" "kvd CPU" "tool(redis)" "tool(kvd)"
awk '
  { key = $2 " " $3; n[$1 " " key]++; rps[$1 " " key] += $4; cpu[$1 " " key] += $6; tool[$1 " " key] += $7; keys[key] = 1 }
  END {
    for (k in keys) {
      split(k, p, " ")
      r = rps["redis " k] / n["redis " k]; v = rps["kvd " k] / n["kvd " k]
      printf "%-6s %-4s %14.0f %14.0f %8.2f %9.0f%% %9.0f%% %11.0f%% %11.0f%%\n", p[1], p[2], r, v, v / r,
        cpu["redis " k] / n["redis " k], cpu["kvd " k] / n["kvd " k], tool["redis " k] / n["redis " k], tool["kvd " k] / n["kvd " k]
    }
  }' "$results" | sort -n -k1,1 -k2,2
rm -f "$results"
