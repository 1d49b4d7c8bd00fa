#!/usr/bin/env bash
# The test suite's proof that it does not depend on a quiet machine: `bash .ci/run` on a fresh
# clone of this checkout's HEAD, several times in a row while a CPU hog keeps every core busy,
# then (with --quiet) once more on another fresh clone with nothing beside it.
#
#   scripts/ci-under-load.sh                 # 3 runs under load
#   scripts/ci-under-load.sh --runs 1 --quiet
#
# Options: --runs N (3), --quiet (also one run on a fresh clone without the hog), --keep (keep
# the clones and logs; by default only the logs are kept). The hog is `stress-ng --cpu N` (N:
# the machine's cores) when installed, else one shell busy loop per core; only the hog's own
# processes are ended, by PID. Prints each run's exit status and wall time, and exits 1 if
# any run failed. Run it as root, as CI does (.ci/run installs what it needs with apt-get).
set -euo pipefail

runs=3
quiet=0
keep=0
while (($#)); do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --quiet) quiet=1; shift ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $runs =~ ^[0-9]+$ ]] || { echo "--runs wants a number, got $runs" >&2; exit 2; }

top=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
head=$(git -C "$top" rev-parse --short HEAD)
work=$(mktemp -d "${TMPDIR:-/tmp}/ci-under-load.XXXXXX")
cores=$(nproc)
hog_pids=()

stop_hog() {
  for pid in "${hog_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${hog_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  hog_pids=()
}
cleanup() {
  stop_hog
  if [[ $keep == 0 ]]; then rm -rf "$work"/clone-*; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_hog() {
  if command -v stress-ng >/dev/null 2>&1; then
    stress-ng --cpu "$cores" --timeout 6h --quiet &
    hog_pids+=("$!")
    echo "hog: stress-ng --cpu $cores (pid ${hog_pids[*]})"
  else
    for ((i = 0; i < cores; i++)); do
      bash -c 'while :; do :; done' &
      hog_pids+=("$!")
    done
    echo "hog: $cores shell busy loops (pids ${hog_pids[*]})"
  fi
}

# run NAME: one `bash .ci/run` in the clone NAME (made fresh from HEAD if it does not exist).
results=()
failed=0
run() {
  local name=$1 label=$2
  local clone="$work/clone-$name" log="$work/$label.log"
  [[ -d $clone ]] || git clone -q "$top" "$clone"
  local began=$SECONDS rc=0
  (cd "$clone" && bash .ci/run) >"$log" 2>&1 || rc=$?
  local took=$((SECONDS - began))
  local line="$label: rc $rc in $((took / 60))m$((took % 60))s ($log)"
  echo "$line"
  results+=("$line")
  [[ $rc == 0 ]] || failed=1
}

echo "fresh clones of $head in $work; $cores cores"
start_hog
for ((r = 1; r <= runs; r++)); do
  run loaded "under-load-$r"
done
stop_hog
if [[ $quiet == 1 ]]; then
  run quiet "quiet"
fi

{
  echo "ci-under-load of $head on $(date -u +%Y-%m-%dT%H:%MZ), $cores cores"
  printf '%s\n' "${results[@]}"
} | tee "$work/summary.txt"
exit "$failed"
