#!/bin/bash
# The training runs before and after a change (issue 17; bench/results/HISTORY.md "Before and after
# --push-by-layer, the default path"): bench/results/pipeline/run.sh with BEFORE's binaries and
# with AFTER's, alternating (which goes first chosen at random each round), ROUNDS rounds, into
# OUT/before and OUT/after. MODELS, PIPELINES, WORKERS, BLAS_THREADS and LOCAL go to run.sh.
#   BEFORE=/tmp/old/build/bin AFTER=build/bin OUT=bench/results/pipeline_ab ROUNDS=5 \
#     bash bench/results/pipeline_ab/run.sh
set -euo pipefail
ROUNDS=${ROUNDS:-5}
OUT=${OUT:-bench/results/pipeline_ab}
HERE=$(dirname "$0")
for ((r = 1; r <= ROUNDS; r++)); do
  for which in $(printf 'before\nafter\n' | shuf); do
    bin=$BEFORE
    [ "$which" = after ] && bin=$AFTER
    BIN=$bin OUT="$OUT/$which" ROUNDS=1 FIRST_ROUND=$r bash "$HERE/../pipeline/run.sh" > /dev/null
    echo "round $r $which done"
  done
done
