#!/usr/bin/env bash
# Hosts on one machine: each a network namespace with its own address, linked by veth pairs
# to a bridge, so a kvd cluster can be run and tested across real (virtual) network links.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage:
  scripts/local-cluster.sh up N [--delay 50us] [--rate 10gbit]
                                [--cpu 0.25 [--uncapped I,J] [--cpu-period-us 100000]]
  scripts/local-cluster.sh down
  scripts/local-cluster.sh exec I CMD [ARGS...]
  scripts/local-cluster.sh status
  scripts/local-cluster.sh addr I

Makes N hosts named PREFIX0..PREFIX(N-1) (PREFIX from --prefix or KV_NS_PREFIX, default kvh),
each a network namespace with loopback and an eth0 at 198.18.77.(I+1)/24, all on one bridge
PREFIXbr. 198.18.0.0/15 is the range reserved for network benchmarking: these addresses exist
only inside the namespaces this script made, and nothing else is ever addressed.

  up N      make the hosts; refuses to touch namespaces or links it did not make
  down      remove everything `up` made (and only that)
  exec I    run a command on host I (e.g. exec 0 ./target/release/kvd --listen 198.18.77.1:7070
            --auth-token-file FILE: a kvd on a host address needs a token, or --insecure-no-auth,
            or it serves only its own host's loopback; see docs/SECURITY.md)
  status    list the hosts, their addresses and what listens on them
  addr I    print host I's address

CPU (optional): --cpu F gives each host a CPU quota of F cores (a cgroup per host: cgroup v2's
cpu.max where the machine has v2 with the cpu controller, else v1's cpu.cfs_quota_us, over a
100 ms period unless --cpu-period-us says otherwise). Every process `exec I` starts joins host I's cgroup, so a host behaves like a
machine of F cores: on a 2-core machine, 8 hosts of 0.25 add up to the machine, and more
servers can show scaling instead of sharing both cores. `status` shows each host's quota.
--uncapped I,J leaves those hosts without a quota (e.g. a client host that must not be the
bottleneck). --cpu-period-us P (default 100000) is the quota's period: a host that uses up
its quota stalls until the period ends, up to (1 - F) x P, which shows in tail latency;
a period of 10000 makes the stalls ten times shorter (and the kernel's accounting busier).

Link shaping (optional, per host egress): --delay D uses tc netem; --rate R uses netem, or tbf
when the kernel has no netem. If the kernel has neither, `up` says so and fails.

Needs root (network namespaces). Without root, use loopback ports instead: every tool here
works on 127.0.0.1 with one port per node, e.g. `scripts/run-cluster.sh --loopback 2 1`.

Options: --prefix NAME (default kvh), --subnet A.B.C (default 198.18.77).
EOF
}

PREFIX=${KV_NS_PREFIX:-kvh}
SUBNET=${KV_NS_SUBNET:-198.18.77}
DELAY=""
RATE=""
CPU=""
UNCAPPED=""
PERIOD_US=100000
ARGS=()
while (($#)); do
  case "$1" in
    --prefix) PREFIX=$2; shift 2 ;;
    --subnet) SUBNET=$2; shift 2 ;;
    --delay) DELAY=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --cpu) CPU=$2; shift 2 ;;
    --uncapped) UNCAPPED=$2; shift 2 ;;
    --cpu-period-us) PERIOD_US=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    exec) ARGS+=("$@"); break ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
set -- "${ARGS[@]+"${ARGS[@]}"}"

STATE_DIR=${KV_NS_STATE_DIR:-/run/kvd-local-cluster}
STATE="$STATE_DIR/$PREFIX.hosts"
BRIDGE="${PREFIX}br"

die() { echo "local-cluster: $*" >&2; exit 2; }

need_root() {
  if [[ $(id -u) -ne 0 ]]; then
    die "network namespaces need root. Without root, run the nodes on loopback ports instead
(kvd --listen 127.0.0.1:7070, :7071, ...), e.g. scripts/run-cluster.sh --loopback 2 1"
  fi
  command -v ip >/dev/null || die "the ip command is missing: apt-get install -y iproute2"
}

host_addr() { echo "$SUBNET.$(($1 + 1))"; }

hosts_made() { [[ -f $STATE ]] && cat "$STATE" || true; }

shape() {
  local ns=$1
  [[ -z $DELAY && -z $RATE ]] && return 0
  local netem=(netem)
  [[ -n $DELAY ]] && netem+=(delay "$DELAY")
  [[ -n $RATE ]] && netem+=(rate "$RATE")
  if ip netns exec "$ns" tc qdisc add dev eth0 root "${netem[@]}" 2>/dev/null; then
    return 0
  fi
  if [[ -z $DELAY ]]; then
    ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst 256kb latency 10ms ||
      die "cannot shape $ns to $RATE (tc tbf failed)"
    return 0
  fi
  die "this kernel has no netem qdisc, so --delay cannot be applied (--rate alone works with tbf)"
}

# The cgroup hierarchy to put host quotas in: "v2 DIR" or "v1 DIR" (DIR holds the hosts'
# groups), or nothing when the machine offers neither.
cgroup_root() {
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
    echo "v2 /sys/fs/cgroup"
  elif [[ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]]; then
    echo "v1 /sys/fs/cgroup/cpu"
  elif [[ -f /sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us ]]; then
    echo "v1 /sys/fs/cgroup/cpu,cpuacct"
  fi
}

# cap HOST_INDEX: make host I's cgroup with the --cpu quota and record it.
cap() {
  local ns=$1 version dir quota
  read -r version dir <<<"$(cgroup_root)"
  [[ -n $version ]] || die "--cpu needs a cgroup cpu controller (v2 cpu.max or v1 cpu.cfs_quota_us); none is mounted"
  quota=$(awk -v f="$CPU" -v p="$PERIOD_US" 'BEGIN { printf "%d", f * p }')
  local group="$dir/kvd-$ns"
  [[ -e $group ]] && die "a cgroup $group exists and was not made by this script; not touching it (use --prefix)"
  mkdir "$group"
  echo "cgroup $ns $group $version" >>"$STATE"
  if [[ $version == v2 ]]; then
    echo "+cpu" >"$dir/cgroup.subtree_control" 2>/dev/null || true
    echo "$quota $PERIOD_US" >"$group/cpu.max"
  else
    echo "$PERIOD_US" >"$group/cpu.cfs_period_us"
    echo "$quota" >"$group/cpu.cfs_quota_us"
  fi
}

# host_cgroup NAME: the cgroup directory of host NAME, if it has one.
host_cgroup() { awk -v ns="$1" '$1 == "cgroup" && $2 == ns { print $3 }' <<<"$(hosts_made)"; }

cmd_up() {
  local n=${1:-}
  [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 200 ]] || die "up needs a host count from 1 to 200"
  if [[ -n $CPU ]]; then
    awk -v f="$CPU" -v c="$(nproc)" 'BEGIN { exit !(f + 0 >= 0.01 && f + 0 <= c) }' ||
      die "--cpu must be a number of cores from 0.01 to $(nproc) (e.g. 0.25)"
  fi
  [[ $PERIOD_US =~ ^[0-9]+$ && $PERIOD_US -ge 1000 && $PERIOD_US -le 1000000 ]] ||
    die "--cpu-period-us must be from 1000 to 1000000 (microseconds)"
  need_root
  [[ -z $(hosts_made) ]] || die "hosts with prefix $PREFIX are already up (see status); run down first"
  for ((i = 0; i < n; i++)); do
    if ip netns list | awk '{print $1}' | grep -qx "$PREFIX$i"; then
      die "a namespace named $PREFIX$i exists and was not made by this script; not touching it (use --prefix)"
    fi
    ip link show "${PREFIX}v$i" >/dev/null 2>&1 && die "a link named ${PREFIX}v$i exists; not touching it (use --prefix)"
  done
  ip link show "$BRIDGE" >/dev/null 2>&1 && die "a link named $BRIDGE exists; not touching it (use --prefix)"
  mkdir -p "$STATE_DIR"
  ip link add "$BRIDGE" type bridge
  echo "bridge $BRIDGE" >"$STATE"
  ip link set "$BRIDGE" up
  for ((i = 0; i < n; i++)); do
    local ns="$PREFIX$i" veth="${PREFIX}v$i"
    ip netns add "$ns"
    echo "host $ns $(host_addr "$i")" >>"$STATE"
    ip link add "$veth" type veth peer name "${veth}p"
    ip link set "${veth}p" netns "$ns"
    ip netns exec "$ns" ip link set "${veth}p" name eth0
    ip netns exec "$ns" ip addr add "$(host_addr "$i")/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
    ip link set "$veth" master "$BRIDGE"
    ip link set "$veth" up
    shape "$ns"
    [[ -z $CPU || ,$UNCAPPED, == *,$i,* ]] || cap "$ns"
  done
  echo "local-cluster: $n hosts up: $(for ((i = 0; i < n; i++)); do printf '%s=%s ' "$PREFIX$i" "$(host_addr "$i")"; done)${CPU:+(each capped at $CPU cores${UNCAPPED:+ but $UNCAPPED})}"
}

cmd_down() {
  need_root
  local made
  made=$(hosts_made)
  [[ -n $made ]] || { echo "local-cluster: nothing to remove for prefix $PREFIX"; return 0; }
  while read -r kind name path _; do
    case "$kind" in
      host)
        # Delete the pair from this side first: namespace teardown is asynchronous.
        ip link del "${PREFIX}v${name#"$PREFIX"}" 2>/dev/null || true
        ip netns del "$name" 2>/dev/null || true
        ;;
      cgroup)
        # A cgroup goes only once its processes have: this script stops none of them.
        local tries=0
        while ! rmdir "$path" 2>/dev/null && [[ -d $path ]]; do
          if ((++tries > 20)); then
            echo "local-cluster: $path still holds processes ($(paste -sd, "$path/cgroup.procs")); stop them, then run down again" >&2
            break
          fi
          sleep 0.1
        done
        ;;
    esac
  done <<<"$made"
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -f "$STATE"
  echo "local-cluster: removed hosts with prefix $PREFIX"
}

cmd_exec() {
  local i=${1:-}
  shift || true
  [[ $i =~ ^[0-9]+$ ]] || die "exec needs a host index"
  (($#)) || die "exec needs a command"
  grep -q "^host $PREFIX$i " <<<"$(hosts_made)" || die "host $PREFIX$i is not up"
  local group
  group=$(host_cgroup "$PREFIX$i")
  # Join the host's cgroup first: exec keeps this PID, so the command and all it starts
  # run under the host's quota.
  if [[ -n $group ]]; then echo $$ >"$group/cgroup.procs"; fi
  exec ip netns exec "$PREFIX$i" "$@"
}

cmd_status() {
  local made
  made=$(hosts_made)
  [[ -n $made ]] || { echo "no hosts up with prefix $PREFIX"; return 0; }
  while read -r kind name addr; do
    [[ $kind == host ]] || continue
    local listening
    listening=$(ip netns exec "$name" ss -ltnH 2>/dev/null | awk '{print $4}' | paste -sd, -)
    local group cpu=""
    group=$(host_cgroup "$name")
    if [[ -f $group/cpu.max ]]; then
      cpu=" cpu: $(awk '{ printf "%.2f cores", $1 / $2 }' "$group/cpu.max")"
    elif [[ -f $group/cpu.cfs_quota_us ]]; then
      cpu=" cpu: $(awk -v p="$(cat "$group/cpu.cfs_period_us")" '{ printf "%.2f cores", $1 / p }' "$group/cpu.cfs_quota_us")"
    fi
    printf '%-10s %-15s listening: %s%s\n' "$name" "$addr" "${listening:-nothing}" "$cpu"
  done <<<"$made"
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  exec) shift; cmd_exec "$@" ;;
  status) cmd_status ;;
  addr) host_addr "${2:?addr needs a host index}" ;;
  ""|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
