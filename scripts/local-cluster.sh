#!/usr/bin/env bash
# Hosts on one machine: each a network namespace with its own address, linked by veth pairs
# to a bridge, so a kvd cluster can be run and tested across real (virtual) network links.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage:
  scripts/local-cluster.sh up N [--delay 50us] [--rate 10gbit]
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
ARGS=()
while (($#)); do
  case "$1" in
    --prefix) PREFIX=$2; shift 2 ;;
    --subnet) SUBNET=$2; shift 2 ;;
    --delay) DELAY=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
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

cmd_up() {
  local n=${1:-}
  [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 200 ]] || die "up needs a host count from 1 to 200"
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
  done
  echo "local-cluster: $n hosts up: $(for ((i = 0; i < n; i++)); do printf '%s=%s ' "$PREFIX$i" "$(host_addr "$i")"; done)"
}

cmd_down() {
  need_root
  local made
  made=$(hosts_made)
  [[ -n $made ]] || { echo "local-cluster: nothing to remove for prefix $PREFIX"; return 0; }
  while read -r kind name _; do
    case "$kind" in
      host)
        # Delete the pair from this side first: namespace teardown is asynchronous.
        ip link del "${PREFIX}v${name#"$PREFIX"}" 2>/dev/null || true
        ip netns del "$name" 2>/dev/null || true
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
    printf '%-10s %-15s listening: %s\n' "$name" "$addr" "${listening:-nothing}"
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
