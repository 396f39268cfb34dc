#!/bin/bash
# bench/results/verified/run.sh — a push checked for NaN/Inf as it is applied (Updater::
# ApplyDenseVerified) against the server before it (a separate NaN/Inf pass, then the update):
# ferry-bench's ps_paired/ (each Ferry call paired with raw ZeroMQ moving the same bytes) with
# build/bin/ferry-ps being, in turn, the two servers. Only the server changed, so one ferry-bench
# serves both arms; which goes first is drawn each round.
#   BEFORE_PS=/tmp/before/build/bin/ferry-ps BUILD=build OUT=bench/results/verified ROUNDS=5 \
#     bash bench/results/verified/run.sh
# Writes OUT/ARM-rR.json (ARM: before, after) and OUT/meta.txt. build/bin/ferry-ps is put back at
# the end (or on failure).
set -euo pipefail
BUILD=${BUILD:-build}
OUT=${OUT:-bench/results/verified}
ROUNDS=${ROUNDS:-5}
ps=$BUILD/bin/ferry-ps
bench=$BUILD/bench/ferry-bench
[ -x "$BEFORE_PS" ] || { echo "run.sh: BEFORE_PS must be the earlier ferry-ps" >&2; exit 1; }
mkdir -p "$OUT"
saved=$(mktemp)
cp "$ps" "$saved"
trap 'cp "$saved" "$ps"; rm -f "$saved"' EXIT
{
  echo "after: commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- . || echo ' (with uncommitted changes)')"
  echo "before: $BEFORE_PS"
  echo "date $(date -u +%FT%TZ)"
  grep -m1 'model name' /proc/cpuinfo
  grep -m1 '^cpu family' /proc/cpuinfo
  grep -m1 '^model[[:space:]]' /proc/cpuinfo
  echo "cores $(nproc)"
} > "$OUT/meta.txt"
for ((r = 1; r <= ROUNDS; ++r)); do
  for arm in $(printf 'before\nafter\n' | shuf); do
    if [ "$arm" = before ]; then cp "$BEFORE_PS" "$ps"; else cp "$saved" "$ps"; fi
    timeout 900 "$bench" --benchmark_filter='^ps_paired/' --benchmark_out="$OUT/$arm-r$r.json" \
      > "$OUT/$arm-r$r.log" 2>&1
    echo "round $r $arm done"
  done
done
uptime > "$OUT/uptime.txt"
