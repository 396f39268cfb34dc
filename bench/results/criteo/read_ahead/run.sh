#!/bin/bash
# The read-ahead A/B of bench/results/HISTORY.md "Reading Criteo files: read-ahead in the trainer": ferry-trainer
# before (OLD) and after (NEW) the read-ahead commit, both built RelWithDebInfo with
# -DFERRY_ENABLE_CUDA=OFF, alternating, 7 rounds, on the 4 gzipped files that
# tests/e2e/test_criteo_stream.py generates for its large set (write_files(dir, 4, 90000, seed=4),
# 103 MB of text) and its test file (seed 99). Columns of runs.txt: build, round, train_s,
# examples/s, compute_s, peak_rss_kib, final AUC (all from the end event).
#   OLD=/path/old/ferry-trainer NEW=/path/new/ferry-trainer DATA=/tmp/criteo-ab bash run.sh > runs.txt
set -euo pipefail
for r in 1 2 3 4 5 6 7; do
  for t in old new; do
    if [ $t = old ]; then B=$OLD; else B=$NEW; fi
    $B --local --device cpu --model ctr --emb-dim 4 --hidden 16 --optimizer adam --lr 0.01 --batch 4096 --steps 89 \
      --criteo-train "$DATA/train/day_*.gz" --criteo-test "$DATA/test_0.gz" --blas-threads 1 \
      --log-every 100000 --metrics-out "$DATA/m-$t-$r.jsonl" --quiet > /dev/null 2>&1
    python3 -c "
import json
e=[json.loads(l) for l in open('$DATA/m-$t-$r.jsonl')]
end=[x for x in e if x['event']=='end'][0]
print('$t', $r, round(end['train_s'],3), round(end['examples_per_sec']), end['time']['compute_s'], end['peak_rss_kib'], end['final']['auc'])"
  done
done
