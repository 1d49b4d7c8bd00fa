#!/usr/bin/env bash
# kvd's RESP front against Redis with each server under the same CPU quota (a cgroup v2
# cpu.max of QUOTA cores each) and the load tools uncapped, so that the tool is not the
# limit and "server CPU per op" is the server's alone. A B A B in one session: memtier
# (YCSB-B-like --ratio=1:19 -d 128 --pipeline=16 -c 25 -t 2) and redis-benchmark -P 16
# GET/SET. Prints each run and a summary: op/s, kvd/Redis, and each server's CPU
# microseconds per op and the part of them spent in the kernel (from its cgroup's cpu.stat).
#
#   scripts/resp-quota-bench.sh                   # 1 core each, 2 rounds, 10 s runs
#   QUOTA=0.5 ROUNDS=3 scripts/resp-quota-bench.sh
#
# Environment: QUOTA (1: cores per server), ROUNDS (2), TEST_TIME (10 s per memtier run),
# RECORDS (1000000, loaded into both by memtier), REQUESTS (2000000 per redis-benchmark
# run), REDIS_PORT (16479), KVD_PORT (17479), KVD_RESP_PORT (16480), MEMTIER_REPO (see
# build-memtier.sh), KVD_BIN (a kvd to use instead of building this checkout's: an A B
# against another build). Needs root (cgroups). Starts only its own redis-server and kvd, in
# cgroups it makes and removes (cgroup v2's cpu.max, or v1's cpu.cfs_quota_us with cpuacct),
# and stops them by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
QUOTA=${QUOTA:-1}
ROUNDS=${ROUNDS:-2}
TEST_TIME=${TEST_TIME:-10}
RECORDS=${RECORDS:-1000000}
REQUESTS=${REQUESTS:-2000000}
REDIS_PORT=${REDIS_PORT:-16479}
KVD_PORT=${KVD_PORT:-17479}
KVD_RESP_PORT=${KVD_RESP_PORT:-16480}

[[ $(id -u) -eq 0 ]] || { echo "resp-quota-bench: cgroups need root" >&2; exit 2; }
if grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
  V=2
elif [[ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us && -f /sys/fs/cgroup/cpuacct/cpuacct.usage ]]; then
  V=1
else
  echo "resp-quota-bench: needs cgroup v2's cpu controller or v1's cpu and cpuacct" >&2; exit 2
fi
command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server redis-tools >/dev/null; }
memtier=$(scripts/build-memtier.sh)
if [[ -n ${KVD_BIN:-} ]]; then
  KVD=$KVD_BIN
else
  cargo build --release --quiet -p kvd
  KVD=$PWD/target/release/kvd
fi

quota_us=$(awk -v q="$QUOTA" 'BEGIN { printf "%d", q * 100000 }')
[[ $V == 2 ]] && echo "+cpu" >/sys/fs/cgroup/cgroup.subtree_control
pids=()
groups=()
cleanup() {
  for p in "${pids[@]+"${pids[@]}"}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]+"${pids[@]}"}"; do wait "$p" 2>/dev/null || true; done
  for g in "${groups[@]+"${groups[@]}"}"; do rmdir "$g" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

# capped NAME CMD...: runs CMD in new cgroups of QUOTA cores (it joins before exec).
capped() {
  local name=kv-resp-quota-$1-$$ dirs
  shift
  if [[ $V == 2 ]]; then
    dirs=(/sys/fs/cgroup/$name)
    mkdir "${dirs[0]}" && echo "$quota_us 100000" >"${dirs[0]}/cpu.max"
  else
    dirs=(/sys/fs/cgroup/cpu/$name /sys/fs/cgroup/cpuacct/$name)
    mkdir "${dirs[@]}"
    echo 100000 >"${dirs[0]}/cpu.cfs_period_us" && echo "$quota_us" >"${dirs[0]}/cpu.cfs_quota_us"
  fi
  groups+=("${dirs[@]}")
  bash -c 'for d in $0; do echo $$ > "$d/cgroup.procs"; done; exec "$@"' "${dirs[*]}" "$@" &
  pids+=("$!")
}
usage_us() {
  if [[ $V == 2 ]]; then
    awk '$1 == "usage_usec" { print $2 }' "/sys/fs/cgroup/kv-resp-quota-$1-$$/cpu.stat"
  else
    echo $(($(cat "/sys/fs/cgroup/cpuacct/kv-resp-quota-$1-$$/cpuacct.usage") / 1000))
  fi
}
# system_us SERVER: the server's CPU time in the kernel (v1 counts it in ticks of 1/USER_HZ s).
system_us() {
  if [[ $V == 2 ]]; then
    awk '$1 == "system_usec" { print $2 }' "/sys/fs/cgroup/kv-resp-quota-$1-$$/cpu.stat"
  else
    awk -v hz="$(getconf CLK_TCK)" '$1 == "system" { print int($2 * 1e6 / hz) }' \
      "/sys/fs/cgroup/cpuacct/kv-resp-quota-$1-$$/cpuacct.stat"
  fi
}

capped redis redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --logfile /tmp/resp-quota-redis.log
capped kvd "$KVD" --listen "127.0.0.1:$KVD_PORT" --resp "127.0.0.1:$KVD_RESP_PORT" --capacity "$RECORDS"
for _ in $(seq 1 100); do
  redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && redis-cli -p "$KVD_RESP_PORT" ping >/dev/null 2>&1 && break
  sleep 0.1
done
echo "== $QUOTA core(s) per server; loading $RECORDS records of 128 B into both (memtier)"
for port in "$REDIS_PORT" "$KVD_RESP_PORT"; do
  "$memtier" -s 127.0.0.1 -p "$port" --ratio=1:0 -d 128 --key-maximum="$RECORDS" --key-pattern=P:P \
    --requests=allkeys -c 4 -t 1 --pipeline=64 --hide-histogram >/dev/null 2>&1
done

results=$(mktemp)
# measure SERVER TOOL LABEL CMD...: runs CMD, reads its op/s from stdout ("Totals" for memtier,
# "GET:"/"SET:" for redis-benchmark) and the server's CPU time from its cgroup.
measure() {
  local server=$1 tool=$2 label=$3 u0 u1 k0 k1 t0 t1 out ops
  shift 3
  u0=$(usage_us "$server"); k0=$(system_us "$server"); t0=$(date +%s.%N)
  out=$("$@" 2>/dev/null | tr '\r' '\n')
  t1=$(date +%s.%N); u1=$(usage_us "$server"); k1=$(system_us "$server")
  case $tool in
    memtier) ops=$(awk '$1 == "Totals" { print $2 }' <<<"$out") ;;
    *) ops=$(grep -E "^$label: [0-9]" <<<"$out" | awk '{ print $2 }' | tail -1) ;;
  esac
  [[ -n $ops ]] || { echo "no figure from $tool against $server" >&2; return; }
  awk -v s="$server" -v l="$label" -v o="$ops" -v u="$((u1 - u0))" -v k="$((k1 - k0))" -v a="$t0" -v b="$t1" 'BEGIN {
    cpu = u / ((b - a) * 1e6); kern = k / ((b - a) * 1e6)
    printf "%-5s %-12s %12.0f op/s  server CPU %3.0f%%  in the kernel %.2f  %.2f us/op\n", s, l, o, 100 * cpu, kern * 1e6 / o, cpu * 1e6 / o
  }' | tee -a "$results"
}

run_memtier() { # server port
  measure "$1" memtier memtier "$memtier" -s 127.0.0.1 -p "$2" --ratio=1:19 -d 128 --pipeline=16 -c 25 -t 2 \
    --key-maximum="$RECORDS" --key-pattern=R:R --test-time="$TEST_TIME" --hide-histogram
}
run_benchmark() { # server port command
  measure "$1" redis-benchmark "$3" redis-benchmark -p "$2" -t "${3,,}" -n "$REQUESTS" -r "$RECORDS" -d 128 -c 50 -P 16 --threads 2 -q
}

for round in $(seq 1 "$ROUNDS"); do
  echo "-- round $round"
  run_memtier redis "$REDIS_PORT"
  run_memtier kvd "$KVD_RESP_PORT"
  for cmd in GET SET; do
    run_benchmark redis "$REDIS_PORT" "$cmd"
    run_benchmark kvd "$KVD_RESP_PORT" "$cmd"
  done
done

echo
echo "== summary over $ROUNDS rounds, $QUOTA core(s) per server (means; us/op is server CPU per op,"
echo "   'kernel' its part in the kernel: a floor no server code removes, as both make the same syscalls)"
awk '
  { n[$1 " " $2]++; ops[$1 " " $2] += $3; us[$1 " " $2] += $(NF - 1); ks[$1 " " $2] += $(NF - 2); labels[$2] = 1 }
  END {
    printf "%-12s %12s %12s %9s %13s %11s %11s %13s %11s\n", "run", "redis op/s", "kvd op/s", "kvd/redis", "redis us/op", "kvd us/op", "kvd/redis", "redis kernel", "kvd kernel"
    for (l in labels) {
      r = ops["redis " l] / n["redis " l]; k = ops["kvd " l] / n["kvd " l]
      ru = us["redis " l] / n["redis " l]; ku = us["kvd " l] / n["kvd " l]
      printf "%-12s %12.0f %12.0f %9.2f %13.2f %11.2f %11.2f %13.2f %11.2f\n", l, r, k, k / r, ru, ku, ku / ru, ks["redis " l] / n["redis " l], ks["kvd " l] / n["kvd " l]
    }
  }' "$results"
rm -f "$results"
