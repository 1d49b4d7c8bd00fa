#!/usr/bin/env bash
# The data-safety fault campaign: each fault an operator (or a machine) meets on a bad day,
# against a durable node and a 3-member replica group on 127.0.0.1, and per fault the
# acknowledged writes lost (must be 0) and how long until writes were acknowledged again.
set -euo pipefail
usage() {
  cat <<'TXT'
Usage: scripts/fault-campaign.sh [--big] [BIN_DIR]

Runs, one after another (as root: the disk faults mount a tmpfs and a loop file system):
  node   kill-9, sigstop (2 s), second-process (a second kvd on the data dir), cut-segment
         (truncate -s 16), deleted-segment, empty-shard-file, disk-full (a 16 MB tmpfs filled,
         then freed), read-only (ext4 made read-only by an error; repaired, remounted)
  group  kill-9-leader, sigstop-leader (2 s), wiped-follower (its data dir deleted; kvd admin
         add-replica), foreign-member (a member of another group at a listed address)
Before each fault a writer stores keys one by one and notes the acknowledged ones; after the
fault (and the operator's repair where there is one) every acknowledged key is read back.
Prints: fault, acknowledged writes, lost, ms until writes were acknowledged again (or what
kvd said when it refused to start). Exit status 1 if anything acknowledged was lost.
BIN_DIR defaults to target/release. Stops only the processes it started, by PID.

--big runs the group faults with big values instead (issue 58): every member with
--max-frame 4mib and --snapshot-every 8mib, each value 1 MiB (a quarter of the frame) and 40
of them per fault (more than one snapshot interval), plus two faults of their own:
  far-behind       a follower killed while the group writes 40 MiB, restarted, then the
                   leader killed (the follower catches up by snapshot or segments read back)
  install-killed   a fourth, blank member added (kvd admin add-replica --learner, a snapshot
                   install of 40 MiB) and the leader killed 300 ms into it
"writes again after" is how long the group went without a leader that acknowledges writes.
TXT
}
[ "${1:-}" = "--help" ] && { usage; exit 0; }
BIG=0
[ "${1:-}" = "--big" ] && { BIG=$((1 << 20)); shift; }
BIN=${1:-target/release}
KVD=$BIN/kvd
[ -x "$KVD" ] || { echo "fault-campaign: $KVD is missing (cargo build --release)" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvd-faults.XXXXXX")
PIDS=()
MOUNTS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for m in "${MOUNTS[@]}"; do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
# (The background kvds are ended by PID with SIGKILL; bash would report each.)
set +m
LOST_TOTAL=0
printf '%-18s %-6s %8s %6s  %s\n' "fault" "on" "acked" "lost" "writes again after / note"

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now_ms() { date +%s%3N; }

# start ADDR DIR [ARGS...]: a kvd in the background; its pid is LAST_PID.
start() {
  local addr=$1 dir=$2; shift 2
  "$KVD" --listen "$addr" --data-dir "$dir" "$@" >>"$WORK/kvd-${addr##*:}.log" 2>&1 &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
  for _ in $(seq 1 100); do "$KVD" stats --nodes "$addr" --timeout 300ms >/dev/null 2>&1 && return 0; sleep 0.05; done
  return 1
}

# value I: the file holding the big value number I mod 26 (--big).
value() {
  local f="$WORK/value-$(($1 % 26))"
  [ -f "$f" ] || head -c "$BIG" /dev/zero | tr '\0' "$(printf "\\$(printf '%03o' $((97 + $1 % 26)))")" >"$f"
  echo "$f"
}

# write NODES PREFIX N [FROM]: stores PREFIX-i (i from FROM+1), notes acknowledged keys in
# $WORK/acked-PREFIX (with --big, each value a file of BIG bytes).
write() {
  local i
  for i in $(seq $((${4:-0} + 1)) $((${4:-0} + $3))); do
    if [ "$BIG" -gt 0 ]; then
      "$KVD" put --nodes "$1" --timeout 10s --file "$(value "$i")" "$2-$i" >/dev/null 2>&1 && echo "$2-$i $(value "$i")" >>"$WORK/acked-$2"
    elif "$KVD" put --nodes "$1" --timeout 3s "$2-$i" "v$i" >/dev/null 2>&1; then echo "$2-$i v$i" >>"$WORK/acked-$2"; fi
  done
}

# lost NODES PREFIX: how many acknowledged keys do not read back.
lost() {
  local n=0 k v
  while read -r k v; do
    if [ "$BIG" -gt 0 ]; then
      "$KVD" get --nodes "$1" --timeout 10s "$k" 2>/dev/null | cmp -s - "$v" || n=$((n + 1))
    else
      [ "$("$KVD" get --nodes "$1" --timeout 5s "$k" 2>/dev/null)" = "$v" ] || n=$((n + 1))
    fi
  done <"$WORK/acked-$2"
  echo "$n"
}

# resume NODES: ms until a write is acknowledged again (30 s at most). Each try gives up
# after 1 s, so that a try sent to a frozen leader costs a second, not the whole wait.
resume() {
  local t0; t0=$(now_ms)
  for _ in $(seq 1 300); do
    "$KVD" put --nodes "$1" --timeout 1s resume-probe x >/dev/null 2>&1 && { echo $(($(now_ms) - t0)); return; }
    sleep 0.1
  done
  echo "never"
}

row() { # fault on prefix nodes note
  local acked l
  acked=$(wc -l <"$WORK/acked-$3" 2>/dev/null || echo 0)
  l=$(lost "$4" "$3")
  LOST_TOTAL=$((LOST_TOTAL + l))
  printf '%-18s %-6s %8s %6s  %s\n' "$1" "$2" "$acked" "$l" "$5"
}

node_fault() { # name: a fresh durable node, 50 writes, the fault, then the check
  local name=$1 addr dir pid note=""
  addr="127.0.0.1:$(port)"; dir="$WORK/node-$name"
  start "$addr" "$dir"; pid=$LAST_PID
  write "$addr" "$name" 50
  case $name in
    kill-9) kill -9 "$pid"; wait "$pid" 2>/dev/null || true; start "$addr" "$dir"; note="$(resume "$addr") ms (restart)" ;;
    sigstop) kill -STOP "$pid"; sleep 2; kill -CONT "$pid"; note="$(resume "$addr") ms" ;;
    second-process)
      if start "127.0.0.1:$(port)" "$dir"; then note="NOT REFUSED"; else note="refused: $(grep -o 'in use by [^:]*' "$WORK"/kvd-*.log | tail -1 | cut -d: -f2-)"; fi ;;
    cut-segment|deleted-segment|empty-shard-file)
      kill "$pid"; wait "$pid" 2>/dev/null || true
      cp -a "$dir" "$dir.copy"
      local seg; seg=$(ls "$dir"/log/*.seg | tail -1)
      case $name in
        cut-segment) truncate -s 16 "$seg" ;;
        deleted-segment) rm "$seg" ;;
        empty-shard-file) : >"$dir/shard" ;;
      esac
      if start "$addr" "$dir"; then note="NOT REFUSED"; else note="refused at start; restored the copy"; fi
      rm -rf "$dir"; mv "$dir.copy" "$dir"; start "$addr" "$dir" ;;
  esac
  row "$name" node "$name" "$addr" "$note"
}

disk_fault() { # full | read-only
  local name=$1 mnt="$WORK/mnt-$1" addr pid img t0 t note
  mkdir -p "$mnt"; addr="127.0.0.1:$(port)"
  if [ "$name" = disk-full ]; then
    mount -t tmpfs -o size=16m tmpfs "$mnt" || { printf '%-18s %-6s %s\n' "$name" node "skipped: cannot mount (not root?)"; return; }
  else
    img="$WORK/ro.img"; truncate -s 64M "$img"; mkfs.ext4 -q "$img"
    mount -o loop,errors=remount-ro "$img" "$mnt" || { printf '%-18s %-6s %s\n' "$name" node "skipped: cannot mount"; return; }
  fi
  MOUNTS+=("$mnt")
  start "$addr" "$mnt/data"; pid=$LAST_PID
  write "$addr" "$name" 50
  t0=$(now_ms)
  if [ "$name" = disk-full ]; then
    dd if=/dev/zero of="$mnt/filler" bs=1M 2>/dev/null || true
    # Writes go on until one is refused (the log's last page may still have room).
    local big; big=$(head -c 1000 /dev/zero | tr '\0' v)
    for i in $(seq 1 200); do
      if "$KVD" put --nodes "$addr" --timeout 5s "$name-$((50 + i))" "$big" 2>"$WORK/full.err" >/dev/null; then
        echo "$name-$((50 + i)) $big" >>"$WORK/acked-$name"
      elif grep -q "refuses writes" "$WORK/full.err"; then break; fi
    done
    t0=$(now_ms)
    sleep 1
    rm -f "$mnt/filler"
    t=$(resume "$addr"); note="$t ms after space returned; $(grep -o 'No space left on device' "$WORK/full.err" | head -1) while full"
  else
    echo 1 >"/sys/fs/ext4/$(basename "$(findmnt -no SOURCE "$mnt")")/trigger_fs_error"
    write "$addr" "$name-during" 5
    kill -9 "$pid"; wait "$pid" 2>/dev/null || true
    umount "$mnt"; e2fsck -fy "$img" >/dev/null 2>&1 || true; mount -o loop "$img" "$mnt"
    start "$addr" "$mnt/data"
    note="$(resume "$addr") ms after repair and restart (Linux keeps an ext4 that hit an error read-only until unmounted)"
  fi
  row "$name" node "$name" "$addr" "$note"
}

group_fault() { # name
  local name=$1 addrs=() dirs=() pids=() i nodes leader victim note=""
  for i in 0 1 2; do addrs+=("127.0.0.1:$(port)"); dirs+=("$WORK/group-$name-$i"); done
  local list; list=$(IFS=,; echo "${addrs[*]}"); nodes=$(IFS='|'; echo "${addrs[*]}")
  for i in 0 1 2; do start "${addrs[$i]}" "${dirs[$i]}" --group "$list" "${GROUP_ARGS[@]}"; pids+=("$LAST_PID"); done
  "$KVD" admin init-group --nodes "$nodes" >/dev/null 2>&1
  write "$nodes" "$name" "$PER_FAULT"
  leader=0
  for i in 0 1 2; do "$KVD" stats --nodes "${addrs[$i]}" --json 2>/dev/null | grep -q '"role": "leader"' && leader=$i; done
  victim=$(((leader + 1) % 3))
  case $name in
    kill-9-leader) kill -9 "${pids[$leader]}"; note="$(resume "$nodes") ms (failover)" ;;
    sigstop-leader)
      # A one-shot client cannot tell a frozen member from a slow one: its write there has
      # an unknown outcome and is not sent again. The probe lists the frozen leader last, as
      # a long-lived client that saw it stall would try it.
      kill -STOP "${pids[$leader]}"
      local order=()
      for i in 0 1 2; do [ "$i" != "$leader" ] && order+=("${addrs[$i]}"); done
      order+=("${addrs[$leader]}")
      note="$(resume "$(IFS='|'; echo "${order[*]}")") ms (failover)"
      kill -CONT "${pids[$leader]}" ;;
    far-behind)
      kill -9 "${pids[$victim]}"
      write "$nodes" "$name" "$PER_FAULT" "$PER_FAULT"
      start "${addrs[$victim]}" "${dirs[$victim]}" --group "$list" "${GROUP_ARGS[@]}"
      kill -9 "${pids[$leader]}"; note="$(resume "$nodes") ms after killing the leader (the follower restarted behind)" ;;
    install-killed)
      # A single fault: a fourth, blank member is added (the three voters stay), and the
      # leader is killed while it is sent the snapshot. (A wiped voter added back with the
      # leader killed is two voters of three gone: no group can elect then.)
      local extra; extra="127.0.0.1:$(port)"
      start "$extra" "$WORK/group-$name-3" --join "${GROUP_ARGS[@]}"
      "$KVD" admin add-replica --learner --nodes "$nodes" --timeout 60s "$extra" >"$WORK/install.out" 2>&1 &
      local adder=$!
      sleep 0.3
      kill -9 "${pids[$leader]}"; note="$(resume "$nodes") ms after killing the leader during the install"
      if wait "$adder"; then note="$note; add-replica finished"; else note="$note; add-replica: $(tail -1 "$WORK/install.out" | cut -c1-80)"; fi ;;
    wiped-follower)
      kill -9 "${pids[$victim]}"; rm -rf "${dirs[$victim]}"
      start "${addrs[$victim]}" "${dirs[$victim]}" --group "$list" "${GROUP_ARGS[@]}"
      "$KVD" admin add-replica --nodes "$nodes" --timeout 60s "${addrs[$victim]}" >/dev/null 2>&1 && note="added back as a new member" || note="ADD-REPLICA FAILED"
      kill -9 "${pids[$leader]}"; note="$note; $(resume "$nodes") ms after killing the old leader" ;;
    foreign-member)
      local x; x="127.0.0.1:$(port)"
      start "$x" "$WORK/foreign-$name" --group "$x"; "$KVD" admin init-group --nodes "$x" >/dev/null 2>&1
      if "$KVD" admin add-replica --nodes "$nodes" "$x" >/dev/null 2>"$WORK/foreign.err"; then note="NOT REFUSED"; else note="refused: $(grep -o 'belongs to another group' "$WORK/foreign.err" | head -1)"; fi ;;
  esac
  row "$name" group "$name" "$nodes" "$note"
}

if [ "$BIG" -gt 0 ]; then
  GROUP_ARGS=(--max-frame 4mib --snapshot-every 8mib)
  PER_FAULT=40
  for f in kill-9-leader sigstop-leader wiped-follower far-behind install-killed; do group_fault "$f"; done
else
  GROUP_ARGS=()
  PER_FAULT=50
  for f in kill-9 sigstop second-process cut-segment deleted-segment empty-shard-file; do node_fault "$f"; done
  for f in disk-full read-only; do disk_fault "$f"; done
  for f in kill-9-leader sigstop-leader wiped-follower foreign-member; do group_fault "$f"; done
fi
echo "acknowledged writes lost in all: $LOST_TOTAL"
[ "$LOST_TOTAL" -eq 0 ]
