#!/bin/bash
# The MLP's training runs of three binaries alternating (which goes first chosen at random each
# round): BEFORE (e4e4139), ENGINE (838219d: the client's I/O engine split, nothing else of the
# client's path changed) and AFTER (f0db54c: dense pieces), bench/results/pipeline/run.sh with the
# MLP, --pipeline exchange, 1 and 2 workers on one ferry-ps, sync and async; ROUNDS rounds.
#   BEFORE=/tmp/engine-before/build/bin ENGINE=/tmp/engine-only/build/bin AFTER=build/bin \
#     OUT=bench/results/dense_pieces/training_mlp ROUNDS=6 bash bench/results/dense_pieces/training_mlp/run.sh
set -euo pipefail
ROUNDS=${ROUNDS:-6}
HERE=$(dirname "$0")
for ((r = 1; r <= ROUNDS; r++)); do
  for which in $(printf 'before\nengine\nafter\n' | shuf); do
    case $which in before) bin=$BEFORE ;; engine) bin=$ENGINE ;; after) bin=$AFTER ;; esac
    BIN=$bin OUT="$OUT/$which" ROUNDS=1 FIRST_ROUND=$r MODELS=mlp PIPELINES=exchange LOCAL=0 \
      bash "$HERE/../../pipeline/run.sh" > /dev/null
    echo "round $r $which done"
  done
done
