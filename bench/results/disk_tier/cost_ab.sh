#!/usr/bin/env bash
# The cost to a RAM-only table of having the disk tier compiled in: ferry-bench's sparse pulls and
# pushes (a table without lifecycle settings or a tier, Zipf batches, one server and one worker in
# one process) built from the commit before the tier (OLD, a ferry-bench binary) and from this
# tree (NEW), in alternating rounds. Writes cost-R-{old,new}.json per round R into OUT, then
# summarize_cost.py's table.
#   bench/results/disk_tier/cost_ab.sh OLD_BIN NEW_BIN OUT [ROUNDS]
# OLD_BIN: e.g. a worktree of 9d26534 built with `ninja -C build ferry-bench`.
set -euo pipefail
old=$1 new=$2 out=$3 rounds=${4:-10}
mkdir -p "$out"
filter='^sparse/(pull|push)/dim'
for r in $(seq 1 "$rounds"); do
  # Alternate which goes first, so that neither always runs on a warmer (or busier) machine.
  if (( r % 2 )); then order="old new"; else order="new old"; fi
  for arm in $order; do
    bin=$old; [[ $arm == new ]] && bin=$new
    "$bin" --benchmark_filter="$filter" --benchmark_format=json --benchmark_out="$out/cost-$r-$arm.json" > /dev/null 2>&1
  done
done
here=$(dirname "$0")
python3 "$here/summarize_cost.py" "$out" "$rounds"
