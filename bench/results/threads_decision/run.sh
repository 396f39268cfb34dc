#!/bin/bash
# The server-threading decision of bench/results/HISTORY.md "The server's threads, decided": ferry-bench's
# in-process servers with no helper thread (compute_threads 0) and one (1, the most this 2-core
# machine can use beside the I/O thread), each with the parallel loops' grain at 2^16 floats
# (ps::Updater::kGrain as shipped: GRAIN16, a ferry-bench built from the tree) and at 2^18
# (GRAIN18, the same tree built with kGrain = 1 << 18). The four run in a random order each round.
#   GRAIN16=build/bench/ferry-bench GRAIN18=/tmp/grain18-bench OUT=bench/results/threads_decision \
#     ROUNDS=5 bash bench/results/threads_decision/run.sh
set -euo pipefail
ROUNDS=${ROUNDS:-5}
FILTER='^criteo_step/(pull|push)/together/(1|2)s1w|^ps/(push|pushpull)/tcp/(1MiB|16MiB)/(1s1w|2s2w)'
for ((r = 1; r <= ROUNDS; r++)); do
  for v in $(printf '16-0\n16-1\n18-0\n18-1\n' | shuf); do
    grain=${v%-*}
    threads=${v#*-}
    bin=$GRAIN16
    [ "$grain" = 18 ] && bin=$GRAIN18
    FERRY_BENCH_COMPUTE_THREADS=$threads "$bin" --benchmark_filter="$FILTER" \
      --benchmark_out="$OUT/grain$grain-threads$threads-round$r.json" --benchmark_out_format=json > /dev/null 2>&1
    echo "round $r grain 2^$grain compute_threads $threads done"
  done
done
