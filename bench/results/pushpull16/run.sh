#!/bin/bash
# Where a 16 MiB push+pull spends its time (issue 17; bench/results/HISTORY.md "Where a 16 MiB push+pull
# spends its time"): in one ferry-bench run each round, the raw ZeroMQ round trip between
# processes, Ferry's push+pull against a ferry-ps process, and the steps Ferry does beside the
# transport, timed apart on one thread (steps/pushpull/16MiB). ROUNDS rounds.
#   BENCH=build/bench/ferry-bench OUT=bench/results/pushpull16 ROUNDS=7 bash bench/results/pushpull16/run.sh
set -euo pipefail
BENCH=${BENCH:-build/bench/ferry-bench}
OUT=${OUT:-bench/results/pushpull16}
ROUNDS=${ROUNDS:-7}
FILTER='^(raw_proc/tcp/16MiB|ps_proc/pushpull/tcp/16MiB|steps/pushpull/16MiB)'
for ((r = 1; r <= ROUNDS; r++)); do
  "$BENCH" --benchmark_filter="$FILTER" --benchmark_out="$OUT/run-$r.json" --benchmark_out_format=json > /dev/null 2>&1
  echo "round $r done"
done
