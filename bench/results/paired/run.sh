#!/bin/bash
# bench/results/paired/run.sh — Ferry's dense calls paired call by call with raw ZeroMQ moving the
# same bytes (ferry-bench's ps_paired/: one ferry-ps process, one echo process, one Ferry call and
# one raw call per iteration in alternating order), then the 1 MiB calls at three piece sizes.
#   BUILD=build OUT=bench/results/paired ROUNDS=3 bash bench/results/paired/run.sh
# Writes OUT/paired-rR.json and OUT/pieces-CFG-rR.json (Google Benchmark's JSON), OUT/meta.txt;
# /usr/bin/python3 bench/results/paired/summarize.py OUT prints the tables.
set -euo pipefail
BUILD=${BUILD:-build}
OUT=${OUT:-bench/results/paired}
ROUNDS=${ROUNDS:-3}
bench=$BUILD/bench/ferry-bench
[ -x "$bench" ] || { echo "run.sh: no $bench (build first)" >&2; exit 1; }
mkdir -p "$OUT"
{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- . || echo ' (with uncommitted changes)')"
  echo "date $(date -u +%FT%TZ)"
  grep -m1 'model name' /proc/cpuinfo
  grep -m1 '^cpu family' /proc/cpuinfo
  grep -m1 '^model[[:space:]]' /proc/cpuinfo
  echo "cores $(nproc)"
} > "$OUT/meta.txt"
# The piece sizes a 1 MiB call is sent in: the library's default (its two chunks of 512 KiB in
# one message), chunks and messages of 256 KiB, and of 128 KiB.
cfgs=(default 256KiB 128KiB)
env_of() {
  case $1 in
    default) echo "" ;;
    256KiB) echo "FERRY_BENCH_CHUNK_ELEMS=65536 FERRY_BENCH_DENSE_MESSAGE_BYTES=262144" ;;
    128KiB) echo "FERRY_BENCH_CHUNK_ELEMS=32768 FERRY_BENCH_DENSE_MESSAGE_BYTES=131072" ;;
  esac
}
for ((r = 1; r <= ROUNDS; ++r)); do
  timeout 900 "$bench" --benchmark_filter='^ps_paired/' --benchmark_out="$OUT/paired-r$r.json" \
    > "$OUT/paired-r$r.log" 2>&1
  n=${#cfgs[@]}
  for ((k = 0; k < n; ++k)); do
    cfg=${cfgs[$(((k + r) % n))]}  # the order rotates from round to round
    # shellcheck disable=SC2046
    env $(env_of "$cfg") timeout 600 "$bench" --benchmark_filter='^ps_paired/(push|pull_view|pushpull)/tcp/1MiB' \
      --benchmark_out="$OUT/pieces-$cfg-r$r.json" > "$OUT/pieces-$cfg-r$r.log" 2>&1
  done
done
uptime > "$OUT/uptime.txt"
