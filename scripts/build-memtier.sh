#!/usr/bin/env bash
# Builds memtier_benchmark (not packaged in Debian 12) from its source at a pinned tag into
# target/tools/bin/memtier_benchmark, installing its Debian build dependencies first (as root)
# when they are missing. Prints the binary's path. Idempotent: a built binary is kept.
#
#   scripts/build-memtier.sh            # tag 2.3.0
#   MEMTIER_TAG=2.2.1 scripts/build-memtier.sh
#   MEMTIER_REPO=/path/to/a/clone scripts/build-memtier.sh   # without GitHub access
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${MEMTIER_TAG:-2.3.0}
OUT=$PWD/target/tools/bin/memtier_benchmark
if [[ -x $OUT ]] && "$OUT" --version 2>/dev/null | grep -q "${TAG}"; then
  echo "$OUT"; exit 0
fi
deps=(build-essential autoconf automake libtool libpcre3-dev libevent-dev pkg-config zlib1g-dev libssl-dev git)
missing=()
for d in "${deps[@]}"; do dpkg -s "$d" >/dev/null 2>&1 || missing+=("$d"); done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then echo "missing ${missing[*]}; installing them needs root" >&2; exit 2; fi
  apt-get update -qq >&2 && apt-get install -y -qq "${missing[@]}" >/dev/null
fi
src=$PWD/target/tools/src/memtier_benchmark
if [[ ! -d $src/.git ]]; then
  mkdir -p "$(dirname "$src")"
  git clone -q ${MEMTIER_REPO:-https://github.com/RedisLabs/memtier_benchmark.git} "$src" >&2
fi
(cd "$src" && git checkout -q "$TAG" && autoreconf -ivf >/dev/null 2>&1 && ./configure -q >/dev/null \
  && make -s -j"$(nproc)" >/dev/null 2>&1)
mkdir -p "$(dirname "$OUT")"
cp "$src/memtier_benchmark" "$OUT"
echo "$OUT"
