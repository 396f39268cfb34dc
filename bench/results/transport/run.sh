#!/bin/bash
# ipc against tcp loopback between ferry-trainer and ferry-ps on one host (bench/results/HISTORY.md "ipc
# or tcp on one host"): bench/results/pipeline/run.sh's MLP and ctr runs with --pipeline exchange
# (the default) and prefetch, 1 and 2 workers, --blas-threads 1, once over each transport per
# round, in a random order, ROUNDS rounds (default 5).
#   BIN=build/bin OUT=bench/results/transport bash bench/results/transport/run.sh
set -euo pipefail
BIN=${BIN:-build/bin}
OUT=${OUT:-bench/results/transport}
ROUNDS=${ROUNDS:-5}
here=$(dirname "$0")
for ((round = 1; round <= ROUNDS; round++)); do
  for t in $(printf 'tcp\nipc\n' | shuf); do
    BIN=$BIN OUT="$OUT/$t" ROUNDS=1 FIRST_ROUND=$round BLAS_THREADS=1 LOCAL=0 PIPELINES="exchange prefetch" \
      TRANSPORT=$t bash "$here/../pipeline/run.sh" > /dev/null
  done
  echo "round $round done"
done
