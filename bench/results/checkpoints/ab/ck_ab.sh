#!/bin/bash
# Alternating A/B of the checkpoint snapshot and write (bench/results/HISTORY.md): B = ferry-ckpt-bench
# built at f050689 (the image zeroed by resize, two CRC passes), A = built at 54b3aad.
set -u
OUT=/work/main/bench/results/checkpoints/ab
mkdir -p $OUT
B=/tmp/ck-before/build/bench/ferry-ckpt-bench
A=/tmp/ferry-ckpt-bench-after
F='^(pause|write)/(dense_adam_64MiB|sparse_adagrad_4Mx16)/'
for i in 1 2 3 4; do
  if [ $((i % 2)) -eq 1 ]; then order="before after"; else order="after before"; fi
  for v in $order; do
    bin=$B; [ $v = after ] && bin=$A
    $bin --dir=/tmp --benchmark_filter="$F" --benchmark_out=$OUT/pair$i-$v.json --benchmark_out_format=json > /dev/null 2>&1
  done
done
echo done
