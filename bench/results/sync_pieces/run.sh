#!/bin/bash
# Sync pushes in pieces held until their last piece (900fcc3, protocol 1.10) against the build
# before them (86d4fcd): the wide MLP (--hidden 256,1024: 1.9 MB of parameters, two pieces a
# push on one ferry-ps, the case the change holds) and the MLP (under 1 MiB: one message, a
# control), sync and async, 1 and 2 workers, bench/results/pipeline/run.sh with --pipeline
# exchange; the two binaries alternating, which goes first chosen at random each round.
# FIRST_ROUND numbers the rounds from there (more rounds into the same folder).
#   BEFORE=/tmp/cc11/build/bin AFTER=build/bin OUT=bench/results/sync_pieces ROUNDS=4 \
#     bash bench/results/sync_pieces/run.sh
set -euo pipefail
ROUNDS=${ROUNDS:-4}
FIRST_ROUND=${FIRST_ROUND:-1}
MODELS=${MODELS:-mlp_wide mlp}
HERE=$(dirname "$0")
for ((r = FIRST_ROUND; r < FIRST_ROUND + ROUNDS; r++)); do
  for which in $(printf 'before\nafter\n' | shuf); do
    bin=$BEFORE
    [ "$which" = after ] && bin=$AFTER
    BIN=$bin OUT="$OUT/$which" ROUNDS=1 FIRST_ROUND=$r MODELS="$MODELS" PIPELINES=exchange LOCAL=0 \
      bash "$HERE/../pipeline/run.sh" > /dev/null
    echo "round $r $which done"
  done
done
