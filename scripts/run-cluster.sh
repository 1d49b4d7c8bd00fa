#!/usr/bin/env bash
# Run a kvd cluster and kvbench clients on several hosts, collect and merge the results.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: scripts/run-cluster.sh [options] SERVERS CLIENTS ["kvd args"] ["kvbench run args"]

Starts `kvd --shard i/SERVERS` on the first SERVERS hosts and `kvbench run` on the next
CLIENTS hosts (each client with its own --seed) against all servers, then merges the clients'
results with `kvbench merge` and prints the total and a per-node table (op/s, CPU, network).
With --replicas R every shard is a replica group of R kvd on R hosts (SERVERS*R server hosts),
each with a data directory, and clients list each group's members with `|`.

Where the hosts come from (pick one):
  --hosts FILE     one host per line ([user@]host; # comments allowed), reached over ssh;
                   KV_HOSTS="h1 h2 ..." does the same. Binaries are built here once and
                   copied to --bin-dir on each host (skip the copy with --shared-bin if that
                   path is on a shared filesystem).
  --local          SERVERS+CLIENTS hosts made on this machine as network namespaces
                   (scripts/local-cluster.sh), created for the run and removed after it. Root.
  --loopback       everything on this machine on 127.0.0.1, one port per server. No root.

Options:
  --cpu F            (--local) each host a machine of F cores: a cgroup CPU quota for every
                     process on it (scripts/local-cluster.sh up --cpu), e.g. 0.25
  --port P           first kvd port (default 7070; server i listens on P, or P+i on loopback)
  --records N        records to preload with `kvbench load` before the clients start (1000000)
  --no-load          do not preload
  --check DURATION   after the benchmark, run `kvbench check` for DURATION from the first client
  --replicas R       each shard a replica group of R members (kvd --group, with --data-dir in
                     the run's directory, or under --bin-dir over ssh); default 1: plain nodes
  --durable          with --replicas 1: each node a durable replica group of one (a data
                     directory, the same log as a group of R), to compare R=1 with R=3
  --nemesis FAULTS   during --check, inject faults from this list, in turn: kill (kill -9 the
                     leader of a random group, restart it 1 s later), pause (SIGSTOP a random
                     member for 1 s, then SIGCONT), partition (cut the leader of a random group
                     off from every other host for 2 s: its eth0 goes down; --local only),
                     isolate (the same for a random follower: the stale-read bound's case).
                     Needs --replicas 3 or more (a majority of each group stays up). The faults
                     go to nemesis.txt (and faults.tsv); the check must still be linearizable,
                     and prints each fault's unavailability as the clients saw it.
  --nemesis-every D  seconds between faults (default 2)
  --reshard          during --check, move half of shard 0's slots to shard 1 and back, again
                     and again (`kvd admin move-slots`, 256 slots a hand-over; needs 2 shards
                     or more); the moves go to reshard.txt. The check must stay linearizable.
  --check-args ARGS  more arguments for `kvbench check`, e.g. "--reads stale --max-staleness
                     500ms" (then the check's status is whether the staleness bound held)
  --bin-dir DIR      where kvd and kvbench live on the hosts (ssh default /tmp/kvd-bin)
  --shared-bin       (ssh) the binaries are already at --bin-dir on every host: do not copy
  --logs DIR         where runs are stored (default logs/); each run gets DIR/<timestamp>/ and
                     DIR/latest points to it
  --auth-token-file FILE
                     the cluster's token (default: a fresh random one for this run, saved as
                     token in the run's directory, mode 600); every kvd requires it and every
                     client presents it. In ssh mode it is copied to --bin-dir on each host.
  --dry-run          print the commands it would run, run nothing
  -h, --help         this help

Every run stores under logs/<timestamp>/: each kvd's and each client's log, client-J.json
per client, merged.json, summary.txt, stats-end.txt, timeline.png and .svg (each shard's p99
batch round trip second by second), and history.json with --check.

What it exposes: in ssh mode each kvd listens on 0.0.0.0:PORT, reachable by anyone who can
reach the host; without the token they are refused, but the traffic is not encrypted (see
docs/SECURITY.md for TLS and firewalls). --local and --loopback stay on this machine.

Every process this script starts is stopped by PID (on each host) when it exits, on Ctrl-C
and on failure; with --local the namespaces are removed too.

Examples:
  scripts/run-cluster.sh --hosts hosts.txt 4 4 "" "--duration 30s --batch 1024"
  scripts/run-cluster.sh --local 2 2 "--threads 1" "--duration 10s"
  scripts/run-cluster.sh --loopback 1 1 "" "--duration 5s --batch 8192"
  scripts/run-cluster.sh --local --replicas 3 --check 10s 2 1 "" "--duration 10s"
EOF
}

MODE=""
CPU=""
HOSTS_FILE=""
PORT=7070
RECORDS=1000000
LOAD=1
CHECK=""
CHECK_ARGS=""
REPLICAS=1
DURABLE=0
NEMESIS=""
NEMESIS_EVERY=2
RESHARD=0
BIN_DIR=""
SHARED_BIN=0
LOGS=logs
DRY=0
TOKEN_FILE=""
POS=()
while (($#)); do
  case "$1" in
    --hosts) MODE=ssh; HOSTS_FILE=$2; shift 2 ;;
    --local) MODE=local; shift ;;
    --cpu) CPU=$2; shift 2 ;;
    --loopback) MODE=loopback; shift ;;
    --port) PORT=$2; shift 2 ;;
    --records) RECORDS=$2; shift 2 ;;
    --no-load) LOAD=0; shift ;;
    --check) CHECK=$2; shift 2 ;;
    --check-args) CHECK_ARGS=$2; shift 2 ;;
    --replicas) REPLICAS=$2; shift 2 ;;
    --durable) DURABLE=1; shift ;;
    --nemesis) NEMESIS=$2; shift 2 ;;
    --nemesis-every) NEMESIS_EVERY=$2; shift 2 ;;
    --reshard) RESHARD=1; shift ;;
    --bin-dir) BIN_DIR=$2; shift 2 ;;
    --shared-bin) SHARED_BIN=1; shift ;;
    --logs) LOGS=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --auth-token-file) TOKEN_FILE=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; POS+=("$@"); break ;;
    -*) [[ ${#POS[@]} -ge 2 ]] && { POS+=("$1"); shift; } || { echo "run-cluster: unknown option $1 (see --help)" >&2; exit 2; } ;;
    *) POS+=("$1"); shift ;;
  esac
done
[[ ${#POS[@]} -ge 2 ]] || { usage >&2; exit 2; }
[[ -z $CPU || $MODE == local ]] || { echo "run-cluster: --cpu needs --local (it caps namespace hosts)" >&2; exit 2; }
SERVERS=${POS[0]}
CLIENTS=${POS[1]}
KVD_ARGS=${POS[2]:-}
BENCH_ARGS=${POS[3]:-}
[[ $SERVERS =~ ^[0-9]+$ && $SERVERS -ge 1 ]] || { echo "run-cluster: SERVERS must be a number >= 1" >&2; exit 2; }
[[ $CLIENTS =~ ^[0-9]+$ && $CLIENTS -ge 1 ]] || { echo "run-cluster: CLIENTS must be a number >= 1" >&2; exit 2; }
[[ $REPLICAS =~ ^[0-9]+$ && $REPLICAS -ge 1 ]] || { echo "run-cluster: --replicas must be a number >= 1" >&2; exit 2; }
if [[ -n $NEMESIS ]]; then
  [[ $REPLICAS -ge 3 ]] || { echo "run-cluster: --nemesis needs --replicas 3 or more (a fault must leave each group a majority)" >&2; exit 2; }
  [[ -n $CHECK ]] || { echo "run-cluster: --nemesis runs during --check DURATION: give --check" >&2; exit 2; }
  for f in ${NEMESIS//,/ }; do
    [[ $f == kill || $f == pause || $f == partition || $f == isolate ]] || { echo "run-cluster: unknown fault '$f' (kill, pause, partition, isolate)" >&2; exit 2; }
    [[ ($f != partition && $f != isolate) || $MODE == local ]] || { echo "run-cluster: the $f fault needs --local (namespace hosts whose links it can cut)" >&2; exit 2; }
  done
  [[ $NEMESIS_EVERY =~ ^[0-9]+$ && $NEMESIS_EVERY -ge 1 ]] || { echo "run-cluster: --nemesis-every must be whole seconds >= 1" >&2; exit 2; }
fi
if ((RESHARD)); then
  [[ $SERVERS -ge 2 ]] || { echo "run-cluster: --reshard moves slots between shards 0 and 1: give 2 shards or more" >&2; exit 2; }
  [[ -n $CHECK ]] || { echo "run-cluster: --reshard runs during --check DURATION: give --check" >&2; exit 2; }
fi
# Server hosts: shard i's member r is host i*REPLICAS+r; the clients come after them.
SERVER_HOSTS=$((SERVERS * REPLICAS))
TOTAL=$((SERVER_HOSTS + CLIENTS))

ROOT=$(cd "$(dirname "$0")/.." && pwd)
LOCAL_CLUSTER="$ROOT/scripts/local-cluster.sh"

if [[ -z $MODE ]]; then
  if [[ -n ${KV_HOSTS:-} ]]; then MODE=ssh; else
    echo "run-cluster: say where the hosts are: --hosts FILE (or KV_HOSTS), --local, or --loopback" >&2
    exit 2
  fi
fi

say() { echo "== $*" >&2; }
die() { echo "run-cluster: $*" >&2; exit 2; }

# ---- hosts --------------------------------------------------------------------------------
HOSTS=()
case "$MODE" in
  ssh)
    if [[ -n $HOSTS_FILE ]]; then
      [[ -f $HOSTS_FILE ]] || die "no such hosts file: $HOSTS_FILE"
      mapfile -t HOSTS < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$HOSTS_FILE" | grep -v '^$')
    else
      read -r -a HOSTS <<<"$KV_HOSTS"
    fi
    [[ ${#HOSTS[@]} -ge $TOTAL ]] || die "need $TOTAL hosts ($SERVERS servers + $CLIENTS clients), have ${#HOSTS[@]}"
    BIN_DIR=${BIN_DIR:-/tmp/kvd-bin}
    ;;
  local)
    PREFIX=${KV_NS_PREFIX:-kvr}
    export KV_NS_PREFIX=$PREFIX
    for ((i = 0; i < TOTAL; i++)); do HOSTS+=("$PREFIX$i"); done
    BIN_DIR=${BIN_DIR:-$ROOT/target/release}
    ;;
  loopback)
    for ((i = 0; i < TOTAL; i++)); do HOSTS+=("localhost"); done
    BIN_DIR=${BIN_DIR:-$ROOT/target/release}
    ;;
esac

# Address clients use for server i.
server_addr() {
  local i=$1
  case "$MODE" in
    ssh) local h=${HOSTS[$i]}; echo "${h#*@}:$PORT" ;;
    local) echo "$("$LOCAL_CLUSTER" addr "$i"):$PORT" ;;
    loopback) echo "127.0.0.1:$((PORT + i))" ;;
  esac
}
listen_addr() {
  case "$MODE" in
    ssh) echo "0.0.0.0:$PORT" ;;
    *) server_addr "$1" ;;
  esac
}

# Shard i's members (host indexes), and the --nodes list: shards by `,`, members by `|`.
members_of() { local i=$1 r; for ((r = 0; r < REPLICAS; r++)); do echo $((i * REPLICAS + r)); done; }
group_of() { local i=$1 h; for h in $(members_of "$i"); do server_addr "$h"; done | paste -sd"$2" -; }
NODES=$(for ((i = 0; i < SERVERS; i++)); do group_of "$i" "|"; done | paste -sd, -)

# ---- running things on hosts --------------------------------------------------------------
# on HOST_INDEX CMD...   run in the foreground on that host
on() {
  local i=$1; shift
  if ((DRY)); then echo "[host $i] $*"; return 0; fi
  case "$MODE" in
    ssh) ssh -o BatchMode=yes "${HOSTS[$i]}" "$(printf '%q ' "$@")" ;;
    local) "$LOCAL_CLUSTER" exec "$i" "$@" ;;
    loopback) "$@" ;;
  esac
}

# spawn HOST_INDEX LOGFILE CMD...   start in the background; records "index pid" in PIDS
PIDS=()
spawn() {
  local i=$1 log=$2; shift 2
  if ((DRY)); then echo "[host $i] $* > $log &"; return 0; fi
  local pid
  case "$MODE" in
    ssh)
      pid=$(ssh -o BatchMode=yes "${HOSTS[$i]}" "nohup $(printf '%q ' "$@") > $(printf '%q' "$BIN_DIR/$(basename "$log")") 2>&1 & echo \$!")
      ;;
    # Through local-cluster.sh, which puts the process in the host's cgroup (--cpu) and
    # execs it: the PID is the process's own.
    local) "$LOCAL_CLUSTER" exec "$i" "$@" >>"$log" 2>&1 & pid=$! ;;
    loopback) "$@" >>"$log" 2>&1 & pid=$! ;;
  esac
  PIDS+=("$i $pid")
}

# fetch HOST_INDEX REMOTE_PATH LOCAL_PATH   bring a file back (no-op when the path is shared)
fetch() {
  if ((DRY)); then echo "[host $1] copy $2 -> $3"; return 0; fi
  case "$MODE" in
    ssh) scp -q -o BatchMode=yes "${HOSTS[$1]}:$2" "$3" ;;
    *) [[ $2 == "$3" ]] || cp "$2" "$3" ;;
  esac
}

# save FILE: copy stdin to FILE (not in a dry run) and to stderr
save() {
  if ((DRY)); then cat >&2; else tee "$1" >&2; fi
}

CLEANED=0
cleanup() {
  ((CLEANED)) && return 0
  CLEANED=1
  ((DRY)) && return 0
  # Servers the nemesis restarted (in its own subshell) are ours too.
  local restarted=()
  [[ -n ${OUT:-} && -f ${OUT:-}/nemesis.pids ]] && mapfile -t restarted <"$OUT/nemesis.pids"
  for entry in "${PIDS[@]+"${PIDS[@]}"}" "${restarted[@]+"${restarted[@]}"}"; do
    read -r i pid <<<"$entry"
    case "$MODE" in
      ssh) ssh -o BatchMode=yes "${HOSTS[$i]}" "kill $pid 2>/dev/null || true" || true ;;
      *) kill "$pid" 2>/dev/null || true ;;
    esac
  done
  if [[ $MODE == ssh && -n ${OUT:-} && -d ${OUT:-} ]]; then
    # Bring the servers' logs home (best effort; they end with the shutdown lines).
    for ((i = 0; i < SERVER_HOSTS; i++)); do
      scp -q -o BatchMode=yes "${HOSTS[$i]}:$BIN_DIR/kvd-$i.log" "$OUT/" 2>/dev/null || true
    done
  fi
  if [[ $MODE != ssh ]]; then
    for entry in "${PIDS[@]+"${PIDS[@]}"}"; do
      read -r _ pid <<<"$entry"
      wait "$pid" 2>/dev/null || true
    done
  fi
  if [[ $MODE == local ]]; then "$LOCAL_CLUSTER" down >/dev/null || true; fi
}
trap cleanup EXIT
trap 'echo "run-cluster: interrupted" >&2; cleanup; exit 130' INT TERM

# ---- the run -------------------------------------------------------------------------------
STAMP=$(date +%Y%m%d-%H%M%S)
OUT="$LOGS/$STAMP"
if ((!DRY)); then
  mkdir -p "$OUT"
  ln -sfn "$STAMP" "$LOGS/latest"
  OUT=$(cd "$OUT" && pwd)
fi
# The token: given, or made for this run (readable by this user only).
if [[ -z $TOKEN_FILE ]]; then
  TOKEN_FILE="$OUT/token"
  if ((!DRY)); then
    (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$TOKEN_FILE")
  fi
fi
[[ $DRY -eq 1 || -r $TOKEN_FILE ]] || die "cannot read the token file $TOKEN_FILE"
((DRY)) || TOKEN_FILE=$(cd "$(dirname "$TOKEN_FILE")" && pwd)/$(basename "$TOKEN_FILE")
# Where each host finds it.
HOST_TOKEN=$TOKEN_FILE
[[ $MODE == ssh ]] && HOST_TOKEN="$BIN_DIR/token"
AUTH=(--auth-token-file "$HOST_TOKEN")

# Where clients write their results: on the host (ssh) or straight into OUT.
RESULT_DIR=$OUT
[[ $MODE == ssh ]] && RESULT_DIR=$BIN_DIR

say "mode $MODE: $SERVERS server(s), $CLIENTS client(s); nodes $NODES; results in $OUT"

if [[ -z ${KV_NO_BUILD:-} && $MODE != ssh || $MODE == ssh && $SHARED_BIN -eq 0 ]]; then
  say "building release binaries"
  if ((DRY)); then echo "cargo build --release -p kvd -p kvbench"; else
    (cd "$ROOT" && cargo build --release --quiet -p kvd -p kvbench)
  fi
fi
if [[ $MODE == ssh && $SHARED_BIN -eq 0 ]]; then
  say "copying binaries to $BIN_DIR on each host"
  for ((i = 0; i < TOTAL; i++)); do
    if ((DRY)); then echo "[host $i] mkdir -p $BIN_DIR; scp kvd kvbench"; continue; fi
    ssh -o BatchMode=yes "${HOSTS[$i]}" "mkdir -p $(printf '%q' "$BIN_DIR")"
    scp -q -o BatchMode=yes "$ROOT/target/release/kvd" "$ROOT/target/release/kvbench" "${HOSTS[$i]}:$BIN_DIR/"
  done
fi
if [[ $MODE == ssh ]]; then
  say "copying the token to $HOST_TOKEN on each host (mode 600)"
  for ((i = 0; i < TOTAL; i++)); do
    if ((DRY)); then echo "[host $i] install -m 600 token $HOST_TOKEN"; continue; fi
    ssh -o BatchMode=yes "${HOSTS[$i]}" "mkdir -p $(printf '%q' "$BIN_DIR") && umask 077 && cat > $(printf '%q' "$HOST_TOKEN")" <"$TOKEN_FILE"
  done
  say "each kvd listens on 0.0.0.0:$PORT: clients need the token; traffic is not encrypted (docs/SECURITY.md)"
fi
KVD="$BIN_DIR/kvd"
KVBENCH="$BIN_DIR/kvbench"
# Merging runs here, with the local build (which is the same binary outside ssh mode).
MERGE_KVBENCH="$ROOT/target/release/kvbench"
[[ $MODE == ssh ]] || MERGE_KVBENCH=$KVBENCH

if [[ $MODE == local ]]; then
  if ((DRY)); then echo "$LOCAL_CLUSTER up $TOTAL${CPU:+ --cpu $CPU}"; else "$LOCAL_CLUSTER" up "$TOTAL" ${CPU:+--cpu "$CPU"} >&2; fi
fi

# start_server HOST: kvd for server host HOST (shard HOST / REPLICAS); its pid is SERVER_PID[HOST].
declare -A SERVER_PID
start_server() {
  local h=$1 i=$(($1 / REPLICAS))
  local group_args=()
  if ((REPLICAS > 1 || DURABLE)); then
    local data="$OUT/data-$h"
    [[ $MODE == ssh ]] && data="$BIN_DIR/data-$h"
    group_args=(--group "$(group_of "$i" ,)" --data-dir "$data")
  fi
  # shellcheck disable=SC2086 # the kvd args are a list of words by design
  spawn "$h" "$OUT/kvd-$h.log" "$KVD" --shard "$i/$SERVERS" --listen "$(listen_addr "$h")" "${AUTH[@]}" "${group_args[@]+"${group_args[@]}"}" $KVD_ARGS
  ((DRY)) || SERVER_PID[$h]=${PIDS[-1]#* }
}

say "starting $SERVER_HOSTS kvd ($SERVERS shard(s) x $REPLICAS)"
for ((h = 0; h < SERVER_HOSTS; h++)); do start_server "$h"; done

# signal HOST SIG: send SIG to server host HOST's kvd.
signal() {
  case "$MODE" in
    ssh) ssh -o BatchMode=yes "${HOSTS[$1]}" "kill -$2 ${SERVER_PID[$1]}" ;;
    *) kill "-$2" "${SERVER_PID[$1]}" ;;
  esac
}

# leader_of SHARD: the host index of the member that says it leads shard SHARD's group (a
# random member if none answers so).
leader_of() {
  local h
  for h in $(members_of "$1"); do
    if on "$FIRST_CLIENT" "$KVD" stats --nodes "$(server_addr "$h")" --json --timeout 500ms "${AUTH[@]}" 2>/dev/null |
      grep -q '"role": "leader"'; then
      echo "$h"
      return
    fi
  done
  echo $(($1 * REPLICAS + RANDOM % REPLICAS))
}

# follower_of SHARD: a member of shard SHARD's group that is not its leader.
follower_of() {
  local leader
  leader=$(leader_of "$1")
  echo $(($1 * REPLICAS + (leader % REPLICAS + 1 + RANDOM % (REPLICAS - 1)) % REPLICAS))
}

# fault HOST NAME TEXT: log a fault on server host HOST, for people (nemesis.txt) and for
# `kvbench check --faults` (faults.tsv: Unix ms, shard, fault, note).
fault() {
  printf '%s %s\n' "$(date +%T.%N | cut -c1-12)" "$3" >>"$OUT/nemesis.txt"
  printf '%s\t%s\t%s\t%s\n' "$(date +%s%3N)" "$(($1 / REPLICAS))" "$2" "$3" >>"$OUT/faults.tsv"
}

# nemesis: until the file $1 exists, every NEMESIS_EVERY seconds one fault from NEMESIS on a
# random server host; one line per fault in $OUT/nemesis.txt.
nemesis() {
  local stop=$1 faults
  read -r -a faults <<<"${NEMESIS//,/ }"
  local n=0
  while [[ ! -e $stop ]] && ((n < 1000)); do
    sleep "$NEMESIS_EVERY"
    [[ -e $stop ]] && break
    local h=$((RANDOM % SERVER_HOSTS)) f=${faults[$((n % ${#faults[@]}))]}
    case "$f" in
      kill)
        h=$(leader_of $((RANDOM % SERVERS)))
        signal "$h" KILL || true
        fault "$h" kill "kill -9 host $h ($(server_addr "$h"), its group's leader); restart in 1 s"
        [[ $MODE == ssh ]] || wait "${SERVER_PID[$h]}" 2>/dev/null || true
        sleep 1
        start_server "$h"
        # This runs in a subshell: tell the cleanup about the new process.
        echo "$h ${SERVER_PID[$h]}" >>"$OUT/nemesis.pids"
        ;;
      pause)
        signal "$h" STOP || true
        fault "$h" pause "SIGSTOP host $h ($(server_addr "$h")) for 1 s"
        sleep 1
        signal "$h" CONT || true
        ;;
      partition | isolate)
        # A group's leader (partition) or a follower (isolate) cut off from every other host.
        local who="its group's leader"
        if [[ $f == partition ]]; then h=$(leader_of $((RANDOM % SERVERS))); else
          h=$(follower_of $((RANDOM % SERVERS)))
          who="a follower"
        fi
        on "$h" ip link set eth0 down || true
        fault "$h" "$f" "host $h ($(server_addr "$h"), $who) cut off for 2 s"
        sleep 2
        on "$h" ip link set eth0 up || true
        ;;
    esac
    n=$((n + 1))
  done
}

# reshard: until the file $1 exists, move half of shard 0's slots to shard 1, then back.
reshard() {
  local stop=$1 last=$((16384 / SERVERS / 2 - 1)) from=0 n=0
  while [[ ! -e $stop ]] && ((n < 1000)); do
    printf '%s move-slots %s -> %s: 0-%s\n' "$(date +%T.%N | cut -c1-12)" "$from" "$((1 - from))" "$last" >>"$OUT/reshard.txt"
    on "$FIRST_CLIENT" "$KVD" admin move-slots --nodes "$NODES" --from "$from" --to "$((1 - from))" "0-$last" "${AUTH[@]}" \
      >>"$OUT/reshard.txt" 2>&1 || echo "move-slots failed (the next run finishes it)" >>"$OUT/reshard.txt"
    from=$((1 - from))
    n=$((n + 1))
  done
}

FIRST_CLIENT=$SERVER_HOSTS
say "waiting until every kvd answers"
if ((!DRY)); then
  ready=0
  for _ in $(seq 1 150); do
    if on "$FIRST_CLIENT" "$KVD" stats --nodes "$NODES" --timeout 500ms "${AUTH[@]}" >/dev/null 2>&1; then ready=1; break; fi
    sleep 0.2
  done
  ((ready)) || { tail -n 5 "$OUT"/kvd-*.log >&2 || true; die "the kvd nodes did not all answer within 30 s"; }
else
  echo "[host $FIRST_CLIENT] $KVD stats --nodes $NODES"
fi
if ((REPLICAS > 1 || DURABLE)); then
  # Every shard is a replica group (of one, when durable without replicas): started once,
  # by one command, for all its members.
  say "starting the replica groups"
  if ((DRY)); then
    echo "[host $FIRST_CLIENT] $KVD admin init-group --nodes $NODES"
  else
    on "$FIRST_CLIENT" "$KVD" admin init-group --nodes "$NODES" "${AUTH[@]}" >"$OUT/init-group.txt" 2>&1 ||
      { cat "$OUT/init-group.txt" >&2; die "kvd admin init-group failed"; }
  fi
fi

if ((LOAD)); then
  say "loading $RECORDS records"
  on "$FIRST_CLIENT" "$KVBENCH" load --quiet --nodes "$NODES" --records "$RECORDS" "${AUTH[@]}" | save "$OUT/load.txt"
fi

say "running $CLIENTS client(s): kvbench run $BENCH_ARGS"
CLIENT_PIDS=()
for ((j = 0; j < CLIENTS; j++)); do
  h=$((SERVER_HOSTS + j))
  # shellcheck disable=SC2086 # the kvbench args are a list of words by design
  cmd=("$KVBENCH" run --quiet --nodes "$NODES" --seed "$((j + 1))" --records "$RECORDS" --json "$RESULT_DIR/client-$j.json" "${AUTH[@]}" $BENCH_ARGS)
  if ((DRY)); then echo "[host $h] ${cmd[*]} > $OUT/client-$j.log"; continue; fi
  on "$h" "${cmd[@]}" >"$OUT/client-$j.log" 2>&1 &
  CLIENT_PIDS+=("$!")
done
failed=0
for pid in "${CLIENT_PIDS[@]+"${CLIENT_PIDS[@]}"}"; do wait "$pid" || failed=$((failed + 1)); done
((failed == 0)) || die "$failed client(s) failed; see $OUT/client-*.log"
for ((j = 0; j < CLIENTS; j++)); do
  fetch "$((SERVER_HOSTS + j))" "$RESULT_DIR/client-$j.json" "$OUT/client-$j.json"
done

CHECK_STATUS=0
if [[ -n $CHECK ]]; then
  say "checking linearizability for $CHECK${NEMESIS:+, with faults: $NEMESIS every ${NEMESIS_EVERY}s}"
  NEMESIS_PID=""
  if [[ -n $NEMESIS && $DRY -eq 0 ]]; then
    : >"$OUT/nemesis.txt"
    : >"$OUT/faults.tsv"
    nemesis "$OUT/nemesis.stop" &
    NEMESIS_PID=$!
  fi
  RESHARD_PID=""
  if ((RESHARD && !DRY)); then
    : >"$OUT/reshard.txt"
    reshard "$OUT/reshard.stop" &
    RESHARD_PID=$!
  fi
  FAULT_ARGS=()
  # The fault log is written here; a client on another machine (ssh) cannot read it.
  [[ -n $NEMESIS && $MODE != ssh ]] && FAULT_ARGS=(--faults "$OUT/faults.tsv")
  # shellcheck disable=SC2086 # the check's extra args are a list of words by design
  on "$FIRST_CLIENT" "$KVBENCH" check --nodes "$NODES" --duration "$CHECK" --history "$RESULT_DIR/history.json" "${AUTH[@]}" "${FAULT_ARGS[@]+"${FAULT_ARGS[@]}"}" $CHECK_ARGS \
    | save "$OUT/check.txt" || CHECK_STATUS=$?
  if [[ -n $NEMESIS_PID ]]; then
    touch "$OUT/nemesis.stop"
    wait "$NEMESIS_PID" || true
    say "faults injected: $(wc -l <"$OUT/nemesis.txt") (see nemesis.txt)"
  fi
  if [[ -n $RESHARD_PID ]]; then
    touch "$OUT/reshard.stop"
    wait "$RESHARD_PID" || true
    say "slot moves: $(grep -c '^kvd: moved' "$OUT/reshard.txt") (see reshard.txt)"
    on "$FIRST_CLIENT" "$KVD" admin slots --nodes "$NODES" "${AUTH[@]}" | tee -a "$OUT/reshard.txt"
  fi
  fetch "$FIRST_CLIENT" "$RESULT_DIR/history.json" "$OUT/history.json" || true
fi

say "merged result"
if ((DRY)); then
  echo "$MERGE_KVBENCH merge $OUT/client-*.json --json $OUT/merged.json --timeline $OUT/timeline"
  echo "[host $FIRST_CLIENT] $KVD stats --nodes $NODES ${AUTH[*]}"
  exit 0
fi
"$MERGE_KVBENCH" merge "$OUT"/client-*.json --json "$OUT/merged.json" --timeline "$OUT/timeline" | tee "$OUT/summary.txt"
# A fault's restart may still be under way: wait (up to 10 s) for every kvd to answer; the final
# stats are for reading, not a verdict.
for _ in $(seq 1 50); do
  on "$FIRST_CLIENT" "$KVD" stats --nodes "$NODES" --timeout 500ms "${AUTH[@]}" >/dev/null 2>&1 && break
  sleep 0.2
done
on "$FIRST_CLIENT" "$KVD" stats --nodes "$NODES" "${AUTH[@]}" | tee "$OUT/stats-end.txt" ||
  say "a kvd did not answer the final stats (see stats-end.txt)"
echo "results: $OUT"
if ((CHECK_STATUS != 0)); then die "kvbench check exited $CHECK_STATUS (1: not linearizable, 2: unknown or error)"; fi
