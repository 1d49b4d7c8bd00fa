#!/usr/bin/env bash
# Writes the golden data directories the compatibility tests read back (kvd/tests/compat.rs):
# small data dirs written by one kvd build, with what they must hold.
#
#   scripts/golden-datadirs.sh OUT [BIN_DIR]
#
# OUT/<case>/ gets each member's data directory and `expected.tsv` (one line per key:
# key, value, deadline in Unix ms or -1 for none; `-` `-` for a key that must be absent),
# and for `moved` also `slots.txt` (`kvd admin slots`). BIN_DIR (default target/release)
# holds the kvd to write them with. Every later log or snapshot format change adds a new
# OUT (kvd/tests/golden/log-format-N) and keeps the old ones readable.
#
# Cases:
#   single  one durable node: puts, deletes, counters, appends, a range write, keys with a
#           far deadline, keys whose deadline passes, a flush, snapshots and a log tail
#   group   a replica group of three (127.77.0.1-3:7070), each member's directory
#   moved   two durable groups of one (127.77.0.11, .12) after slots 0-99 moved from group 0
#           to group 1, and writes after the move
set -euo pipefail

out=${1:?usage: golden-datadirs.sh OUT [BIN_DIR]}
bin=${2:-target/release}
kvd=$bin/kvd
[[ -x $kvd ]] || { echo "no kvd at $kvd (cargo build --release -p kvd)" >&2; exit 2; }
command -v redis-cli >/dev/null || { echo "redis-cli is needed (Debian's redis-tools)" >&2; exit 2; }
[[ -e $out ]] && { echo "$out exists: give a new directory" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
export KV_NODES=

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# start NAME ARGS...: a kvd in the background, logging to OUT/NAME.log; waits for its ready
# line and sets `resp` to the RESP address it reports.
start() {
  local name=$1
  shift
  "$kvd" "$@" >/dev/null 2>"$out/$name.log" &
  pids+=("$!")
  for _ in $(seq 1 300); do
    if grep -q ' listening on ' "$out/$name.log"; then
      resp=$(grep -o 'speaks RESP on [^ ]*' "$out/$name.log" | head -1 | cut -d' ' -f4)
      return 0
    fi
    sleep 0.1
  done
  echo "kvd $name did not start:" >&2
  cat "$out/$name.log" >&2
  exit 1
}

# stop: SIGTERM to every kvd started so far (a clean shutdown, as before an upgrade).
stop() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
  rm -f "$out"/*.log
}

# r ADDR ARGS...: one redis-cli command; fails on an error reply.
r() {
  local addr=$1
  shift
  local said
  said=$(redis-cli -h "${addr%:*}" -p "${addr##*:}" "$@")
  [[ $said != ERR* && $said != *READONLY* ]] || { echo "redis-cli $*: $said" >&2; exit 1; }
  printf '%s' "$said"
}

# expect ADDR FILE KEY...: appends each key's value and deadline, as the node answers them,
# to FILE (absent keys as `-`).
expect() {
  local addr=$1 file=$2
  shift 2
  for key in "$@"; do
    if [[ $(r "$addr" EXISTS "$key") == 1 ]]; then
      printf '%s\t%s\t%s\n' "$key" "$(r "$addr" GET "$key")" "$(r "$addr" PEXPIRETIME "$key")" >>"$file"
    else
      printf '%s\t-\t-\n' "$key" >>"$file"
    fi
  done
}

# The workload every case runs through ADDR (a node or a group's leader), with key prefix P.
workload() {
  local a=$1 p=$2
  for i in $(seq 0 59); do r "$a" SET "${p}flushed$i" "gone$i" >/dev/null; done
  r "$a" FLUSHALL SYNC >/dev/null
  for i in $(seq 0 149); do r "$a" SET "${p}k$i" "v$i" >/dev/null; done
  for i in $(seq 0 9); do r "$a" DEL "${p}k$i" >/dev/null; done
  for _ in $(seq 1 7); do r "$a" INCR "${p}counter" >/dev/null; done
  r "$a" INCRBY "${p}negative" -12 >/dev/null
  for _ in $(seq 1 5); do r "$a" APPEND "${p}appended" ab >/dev/null; done
  r "$a" SETRANGE "${p}appended" 1 XY >/dev/null
  r "$a" SET "${p}far" "until 2100" EXAT 4102444800 >/dev/null
  r "$a" SET "${p}kept-ttl" x EXAT 4102444800 >/dev/null
  r "$a" INCR "${p}kept-ttl-counter" >/dev/null
  r "$a" EXPIREAT "${p}kept-ttl-counter" 4102444800 >/dev/null
  r "$a" SET "${p}soon" "gone in a minute" EX 60 >/dev/null
  r "$a" SET "${p}persisted" y EX 1000 >/dev/null
  r "$a" PERSIST "${p}persisted" >/dev/null
  for i in $(seq 0 29); do r "$a" SET "${p}tail$i" "t$i" >/dev/null; done
}

# The keys the workload leaves, present or absent.
workload_keys() {
  local p=$1
  for i in $(seq 0 59); do echo "${p}flushed$i"; done
  for i in $(seq 0 149); do echo "${p}k$i"; done
  for k in counter negative appended far kept-ttl kept-ttl-counter soon persisted; do echo "$p$k"; done
  for i in $(seq 0 29); do echo "${p}tail$i"; done
}

# 1. One durable node: a snapshot every 40 entries, so the directory holds snapshots and a
# log tail after the newest.
mkdir -p "$out/single"
start single --listen 127.0.0.1:0 --resp 127.0.0.1:0 --data-dir "$out/single/data" --snapshot-every 40entries
workload "$resp" ""
mapfile -t keys < <(workload_keys "")
expect "$resp" "$out/single/expected.tsv" "${keys[@]}"
stop

# 2. A replica group of three on addresses of their own (kept in the group's membership).
mkdir -p "$out/group"
members=127.77.0.1:7070,127.77.0.2:7070,127.77.0.3:7070
for m in 1 2 3; do
  start "member$m" --listen "127.77.0.$m:7070" --resp "127.77.0.$m:6380" --group "$members" \
    --data-dir "$out/group/member$m" --snapshot-every 60entries
done
"$kvd" admin init-group --nodes "${members//,/|}" >/dev/null
leader=""
for _ in $(seq 1 100); do
  for m in 1 2 3; do
    if redis-cli -h "127.77.0.$m" -p 6380 INFO replication | grep -q role:master; then leader="127.77.0.$m:6380"; fi
  done
  [[ -n $leader ]] && break
  sleep 0.1
done
[[ -n $leader ]] || { echo "the group elected no leader" >&2; exit 1; }
workload "$leader" "g-"
mapfile -t keys < <(workload_keys "g-")
expect "$leader" "$out/group/expected.tsv" "${keys[@]}"
stop

# 3. Two durable groups of one; slots 0-99 move from group 0 to group 1; writes after.
mkdir -p "$out/moved"
nodes=127.77.0.11:7070,127.77.0.12:7070
for g in 0 1; do
  addr="127.77.0.1$((g + 1)):7070"
  start "group$g" --shard "$g/2" --listen "$addr" --resp "127.77.0.1$((g + 1)):6380" --nodes "$nodes" \
    --group "$addr" --data-dir "$out/moved/group$g"
  "$kvd" admin init-group --nodes "$addr" >/dev/null
done
# Keys of the slots that move (found with CLUSTER KEYSLOT), and of others.
moving=()
staying=()
for i in $(seq 0 3000); do
  slot=$(r 127.77.0.11:6380 CLUSTER KEYSLOT "m$i")
  if ((slot < 100)); then moving+=("m$i"); elif ((${#staying[@]} < 40)); then staying+=("m$i"); fi
  ((${#moving[@]} >= 20 && ${#staying[@]} >= 40)) && break
done
for k in "${moving[@]}" "${staying[@]}"; do "$kvd" put --nodes "$nodes" "$k" "before-$k" >/dev/null; done
"$kvd" admin move-slots --nodes "$nodes" --from 0 --to 1 0-99 >/dev/null 2>&1
for k in "${moving[@]:0:5}"; do "$kvd" put --nodes "$nodes" "$k" "after-$k" >/dev/null; done
"$kvd" admin slots --nodes "$nodes" >"$out/moved/slots.txt"
for k in "${moving[@]}" "${staying[@]}"; do
  printf '%s\t%s\t-1\n' "$k" "$("$kvd" get --nodes "$nodes" --text "$k")" >>"$out/moved/expected.tsv"
done
stop
rm -f "$out"/*/*/LOCK
echo "golden data directories in $out, written by $("$kvd" --version 2>/dev/null || echo kvd)"
