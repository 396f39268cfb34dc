#!/bin/bash
# Alternating A/B of the push path (bench/results/HISTORY.md, "Refusing NaN and Inf"): B = ferry-bench
# built at 261a349 (no NaN/Inf check, a git worktree in /tmp/ab-before), A = ferry-bench built at
# 3f7c126 (the check on the I/O thread) and copied to /tmp/ferry-bench-after.
set -u
OUT=/work/main/bench/results/nonfinite-ab
mkdir -p $OUT
B=/tmp/ab-before/build/bench/ferry-bench
A=/tmp/ferry-bench-after
F='^(raw/tcp/(4KiB|16MiB)|ps/push/tcp/(4KiB|1MiB|16MiB)/1s1w|ps/pushpull/tcp/(4KiB|16MiB)/1s1w|sparse/push/dim16)/'
for i in 1 2 3 4 5 6 7 8; do
  if [ $((i % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for v in $order; do
    bin=$B; [ $v = after ] && bin=$A
    $bin --benchmark_filter="$F" --benchmark_format=json --benchmark_out=$OUT/pair$i-$v.json --benchmark_out_format=json > /dev/null 2>&1
  done
done
echo done
