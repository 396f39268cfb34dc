#!/bin/sh
# The hand-over's pause before and after HandOverFilter, in one run, alternating:
#   bench/results/placement/handover_ab.sh BEFORE_BIN AFTER_BIN PAIRS OUT_DIR
# Each binary is a ferry-handover-bench; each run moves every slot of server 1 to server 0 and
# back once (--rounds 1), with its own checkpoint folder under /tmp.
set -eu
before=$1 after=$2 pairs=$3 out=$4
mkdir -p "$out"
for i in $(seq 1 "$pairs"); do
  for which in before after; do
    bin=$before
    [ "$which" = after ] && bin=$after
    echo "# pair $i, $which: $bin ($(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1 /proc/loadavg))"
    "$bin" --rounds 1 --dir "/tmp/ferry-handover-ab-$which"
  done
done > "$out/handover_ab.txt" 2>&1
