#!/usr/bin/env bash
# Captures of the real kvtui, as text, for docs/KVTUI.md: three kvd nodes on 127.0.0.1 under a
# bounded kvbench run, kvtui in a detached tmux session; one node is killed, then restarted.
# Prints each capture to stdout with a heading. Ends only the processes it started, by PID.
set -euo pipefail
usage() {
  cat <<'TXT'
Usage: scripts/kvtui-captures.sh [BIN_DIR]

BIN_DIR holds kvd, kvbench and kvtui (default target/release). Needs tmux. Ports 17500-17502
(PORT=... to move them). Takes about 40 s.
TXT
}
if [ "${1:-}" = "--help" ]; then usage; exit 0; fi
BIN=${1:-target/release}
PORT=${PORT:-17500}
command -v tmux >/dev/null || { echo "kvtui-captures: tmux is needed" >&2; exit 2; }
session="kvcap$$"
pids=()
nodes="127.0.0.1:$PORT,127.0.0.1:$((PORT + 1)),127.0.0.1:$((PORT + 2))"
cleanup() {
  tmux kill-session -t "$session" 2>/dev/null || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
start_node() { # index
  "$BIN/kvd" --shard "$1/3" --listen "127.0.0.1:$((PORT + $1))" >/dev/null 2>&1 &
  node_pid[$1]=$!
  pids+=("$!")
}
declare -a node_pid
for i in 0 1 2; do start_node "$i"; done
"$BIN/kvd" stats --nodes "$nodes" --timeout 5s >/dev/null 2>&1 || sleep 1
"$BIN/kvbench" load --nodes "$nodes" --records 200000 --quiet >/dev/null
"$BIN/kvbench" run --nodes "$nodes" --records 200000 --duration 30s --warmup 1s --timeout 1s >/dev/null 2>&1 &
pids+=("$!")
capture() { # title
  printf '### %s\n\n```text\n' "$1"
  tmux capture-pane -p -t "$session" | sed 's/[[:space:]]*$//'
  printf '```\n\n'
}
tmux new-session -d -s "$session" -x 160 -y 45 "$BIN/kvtui --nodes $nodes"
sleep 6
capture "160x45, three nodes under YCSB-B"
kill -9 "${node_pid[2]}"
sleep 5
capture "160x45, node 3 killed (kill -9) 5 s ago"
start_node 2
sleep 5
capture "160x45, node 3 restarted (empty: it kept nothing in memory)"
tmux resize-window -t "$session" -x 80 -y 24
sleep 2
capture "80x24, the same"
kill -9 "${node_pid[2]}"
sleep 4
capture "80x24, node 3 killed again"
