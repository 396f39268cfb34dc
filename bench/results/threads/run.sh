#!/bin/bash
# The server-threading A/B of bench/results/HISTORY.md "The server's helper threads": ferry-bench with its
# in-process servers at compute_threads 0 (no helper: the I/O thread does everything) and 1 (one
# helper, the most this 2-core machine can use beside the I/O thread), alternating, 3 rounds.
#   BENCH=build/bench/ferry-bench OUT=bench/results/threads bash bench/results/threads/run.sh
set -euo pipefail
FILTER='^criteo_step/(pull|push)/together/(1|2)s1w|^ps/(push|pushpull)/tcp/(1MiB|16MiB)/(1s1w|2s2w)'
for r in 1 2 3; do
  for t in 0 1; do
    FERRY_BENCH_COMPUTE_THREADS=$t "$BENCH" --benchmark_filter="$FILTER" \
      --benchmark_out="$OUT/threads-$t-round-$r.json" --benchmark_out_format=json > /dev/null 2>&1
    echo "round $r compute_threads $t done"
  done
done
