#!/bin/bash
# Issue 34, slice 1: a program written on Ferry's client as a user writes it (no allocator tuning
# of its own) before and after the library tunes the allocator itself (transport.h,
# TuneAllocatorForLargeMessages, applied by Client::Connect and Server::Start). ROUNDS rounds, each
# one ferry-bench run of the process benchmarks per mode, in a random order:
#   off  FERRY_MALLOC_TUNING=off: the measuring (client) process untuned, as every user program
#        was before; ferry-ps and the echo process keep their own tuning, as before
#   on   the default: the library tunes the client process too
# The benchmarks: raw_proc (raw ZeroMQ echo of one frame between the same kind of processes: the
# limit) and ps_proc push, pull and push+pull against a ferry-ps process, at 4 KiB, 1 MiB, 16 MiB.
# FILTER picks other benchmarks (a --benchmark_filter regex).
#   BUILD=build OUT=bench/results/malloc_tuning ROUNDS=5 bash bench/results/malloc_tuning/run.sh
set -euo pipefail
BUILD=${BUILD:-build}
OUT=${OUT:-bench/results/malloc_tuning}
ROUNDS=${ROUNDS:-5}
mkdir -p "$OUT/runs"
{
  echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench/results' || echo ' (dirty)')"
  echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "rounds $ROUNDS"
} > "$OUT/run.log"
for ((round = 1; round <= ROUNDS; round++)); do
  for mode in $(printf 'off\non\n' | shuf); do
    echo "round $round: $mode" >> "$OUT/run.log"
    FERRY_MALLOC_TUNING=$mode "$BUILD/bench/ferry-bench" --benchmark_filter="${FILTER:-^(raw_proc|ps_proc)/}" \
      --benchmark_format=json --benchmark_out="$OUT/runs/$mode-r$round.json" > /dev/null
  done
done
/usr/bin/python3 "$(dirname "$0")/summarize.py" "$OUT" > "$OUT/summary.txt"
cat "$OUT/summary.txt"
