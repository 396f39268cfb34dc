#!/bin/bash
# Nothing slower elsewhere (issue 17; bench/results/HISTORY.md "Before and after this stop"): the existing
# ferry-bench cases that both binaries have, BEFORE's and AFTER's ferry-bench alternating (which
# goes first chosen at random each round), ROUNDS rounds of one repetition each.
#   BEFORE=/path/to/old/ferry-bench AFTER=build/bench/ferry-bench OUT=bench/results/before_after \
#     bash bench/results/before_after/run.sh
set -euo pipefail
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-bench/results/before_after}
FILTER=${FILTER:-'^(ps/(push|pull|pushpull)/tcp/(4KiB|1MiB|16MiB)/(1s1w|2s2w)|small/|sparse/(pull|push)/|criteo_step/(pull|push)/together/|opt/)'}
for ((r = 1; r <= ROUNDS; r++)); do
  for which in $(printf 'before\nafter\n' | shuf); do
    bin=$BEFORE
    [ "$which" = after ] && bin=$AFTER
    "$bin" --benchmark_filter="$FILTER" --benchmark_out="$OUT/$which-$r.json" --benchmark_out_format=json > /dev/null 2>&1
    echo "round $r $which done"
  done
done
