#!/bin/bash
# Re-runs every summarize.py under bench/results/ over its recorded data and compares its output
# with the summary.txt beside it (bench/RESULTS.md, "Reproducing"). Scripts without a recorded
# summary.txt are run and must succeed; their figures are quoted in RESULTS.md and HISTORY.md.
# Folders whose raw runs were never committed are listed, not checked. Exits 1 on any difference.
#   bench/results/check_summaries.sh            (from the repository root; needs numpy-free Python 3)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-/usr/bin/python3}
R=bench/results
fail=0

same() {  # same SUMMARY SCRIPT [ARGS...]: the script's output equals SUMMARY
  local want=$1
  shift
  if "$PY" "$@" 2>/dev/null | diff -q - "$want" > /dev/null; then
    echo "same     $want"
  else
    echo "DIFFERS  $want  ($*)"
    fail=1
  fi
}

runs() {  # runs SCRIPT [ARGS...]: the script succeeds and prints something
  if [ -n "$("$PY" "$@" 2>/dev/null)" ]; then
    echo "runs     $*"
  else
    echo "FAILS    $*"
    fail=1
  fi
}

same $R/before_after/summary.txt $R/before_after/summarize.py $R/before_after
same $R/before_after/focus/summary.txt $R/before_after/summarize.py $R/before_after/focus
same $R/before_after_drive/summary.txt $R/before_after/summarize.py $R/before_after_drive
same $R/client_engine/summary.txt $R/before_after/summarize.py $R/client_engine
same $R/client_engine/focus/summary.txt $R/before_after/summarize.py $R/client_engine/focus
same $R/client_engine/focus2/summary.txt $R/before_after/summarize.py $R/client_engine/focus2
same $R/dense_pieces/summary.txt $R/before_after/summarize.py $R/dense_pieces
same $R/dense_pieces/vs_raw.txt $R/dense_pieces/vs_raw.py $R/dense_pieces
same $R/dense_pieces/run2/summary.txt $R/before_after/summarize.py $R/dense_pieces/run2
same $R/dense_pieces/run2/vs_raw.txt $R/dense_pieces/vs_raw.py $R/dense_pieces/run2
same $R/dense_pieces/sizes/summary.txt $R/dense_pieces/sizes/summarize.py $R/dense_pieces/sizes
same $R/dense_pieces/training/summary.txt $R/pipeline_ab/summarize.py $R/dense_pieces/training
same $R/dense_pieces/training_mlp/summary.txt $R/dense_pieces/training_mlp/summarize.py $R/dense_pieces/training_mlp
same $R/one_pass/summary.txt $R/before_after/summarize.py $R/one_pass
same $R/one_pass/vs_raw.txt $R/dense_pieces/vs_raw.py $R/one_pass
same $R/one_pass/steps/summary.txt $R/one_pass/steps_summarize.py $R/one_pass
same $R/peer_pslite/1x1/summary.txt bench/peer/summarize.py $R/peer_pslite/1x1
same $R/peer_pslite/2x2/summary.txt bench/peer/summarize.py $R/peer_pslite/2x2
same $R/peer_pslite/1x1_run2/summary.txt bench/peer/summarize.py $R/peer_pslite/1x1_run2
same $R/zero_copy/1x1/summary.txt bench/peer/summarize.py $R/zero_copy/1x1
same $R/zero_copy/2x2/summary.txt bench/peer/summarize.py $R/zero_copy/2x2
same $R/zero_copy/training/summary.txt $R/sync_pieces/summarize.py $R/zero_copy/training
same $R/zero_copy/cpu_per_example/after/summary.txt $R/cpu_per_example/summarize.py $R/zero_copy/cpu_per_example/after
same $R/zero_copy/cpu_per_example/before/summary.txt $R/cpu_per_example/summarize.py $R/zero_copy/cpu_per_example/before
same $R/paired/summary.txt $R/paired/summarize.py $R/paired
same $R/verified/summary.txt $R/verified/summarize.py $R/verified
same $R/paired/2x2/summary.txt bench/peer/summarize.py $R/paired/2x2
same $R/sync_pieces/summary.txt $R/sync_pieces/summarize.py $R/sync_pieces
same $R/sparse_dedup/client/summary.txt $R/before_after/summarize.py $R/sparse_dedup/client
same $R/sparse_dedup/bench/summary.txt $R/before_after/summarize.py $R/sparse_dedup/bench
same $R/cpu_per_example/summary.txt $R/cpu_per_example/summarize.py $R/cpu_per_example
same $R/cpu_per_example/batch256/summary.txt $R/cpu_per_example/summarize.py $R/cpu_per_example/batch256
same $R/client_drive/summary.txt $R/client_drive/summarize.py $R/client_drive
same $R/client_drive/run2/summary.txt $R/client_drive/summarize.py $R/client_drive/run2
same $R/client_drive/no_notify/summary.txt $R/client_drive/summarize.py $R/client_drive/no_notify
same $R/curve/summary.txt $R/curve/summarize.py $R/curve/curve.json
same $R/pipeline/blas0/summary.txt $R/pipeline/summarize.py $R/pipeline/blas0
same $R/pipeline/blas1/summary.txt $R/pipeline/summarize.py $R/pipeline/blas1
same $R/pipeline4/blas1/summary.txt $R/pipeline/summarize.py $R/pipeline4/blas1
same $R/pipeline_ab/summary.txt $R/pipeline_ab/summarize.py $R/pipeline_ab
same $R/pipeline_ab/ctr_exchange/summary.txt $R/pipeline_ab/summarize.py $R/pipeline_ab/ctr_exchange
same $R/pipeline_ab/mlp/summary.txt $R/pipeline_ab/summarize.py $R/pipeline_ab/mlp
same $R/processes/summary.txt $R/processes/summarize.py $R/processes/run.json
same $R/pushpull16/summary.txt $R/pushpull16/summarize.py $R/pushpull16
same $R/threads_decision/summary.txt $R/threads_decision/summarize.py $R/threads_decision
same $R/torch_dlrm/prefetch/summary.txt $R/torch_dlrm/summarize.py $R/torch_dlrm/prefetch
same $R/torch_dlrm/bags/summary.txt $R/torch_dlrm/summarize.py $R/torch_dlrm/bags
same $R/malloc_tuning/summary.txt $R/malloc_tuning/summarize.py $R/malloc_tuning
same $R/malloc_tuning/small/summary.txt $R/malloc_tuning/summarize.py $R/malloc_tuning/small
same $R/transport/summary.txt $R/transport/summarize.py $R/transport
same $R/disk_tier/summary-1.txt $R/disk_tier/summarize.py $R/disk_tier/run-1.json
same $R/disk_tier/summary-2.txt $R/disk_tier/summarize.py $R/disk_tier/run-2.json
same $R/disk_tier/summary-shard-1.txt $R/disk_tier/summarize.py $R/disk_tier/run-shard-1.json
same $R/disk_tier/summary-shard-2.txt $R/disk_tier/summarize.py $R/disk_tier/run-shard-2.json
same $R/disk_tier/summary-shard-3.txt $R/disk_tier/summarize.py $R/disk_tier/run-shard-3.json
same $R/disk_tier/summary-shard-4.txt $R/disk_tier/summarize.py $R/disk_tier/run-shard-4.json
same $R/disk_tier/summary-shard-uniform-1.txt $R/disk_tier/summarize.py $R/disk_tier/run-shard-uniform-1.json
same $R/disk_tier/summary-shard-uniform-2.txt $R/disk_tier/summarize.py $R/disk_tier/run-shard-uniform-2.json
for n in server-1 server-2 server-3 server-4 server-w1-1 server-w1-2 server-uniform-1; do
  same $R/disk_tier/summary-$n.txt $R/disk_tier/summarize.py $R/disk_tier/run-$n.json
done
same $R/disk_tier/summary-cost-1.txt $R/disk_tier/summarize_cost.py $R/disk_tier/cost-1 10
same $R/disk_tier/summary-cost-2.txt $R/disk_tier/summarize_cost.py $R/disk_tier/cost-2 10
same $R/gpu/h100_1/summary.txt bench/gpu/summarize.py $R/gpu/h100_1
same $R/gpu/h100_2/summary.txt bench/gpu/summarize.py $R/gpu/h100_2
same $R/gpu/h100_3/summary.txt bench/gpu/summarize.py $R/gpu/h100_3
same $R/gpu/h200_4/summary.txt bench/gpu/summarize.py $R/gpu/h200_4
same $R/disk_tier/summary-victims-zipf.txt $R/disk_tier/summarize_victims.py $R/disk_tier/victims-zipf
same $R/disk_tier/summary-victims-uniform.txt $R/disk_tier/summarize_victims.py $R/disk_tier/victims-uniform
same $R/gpu/h200_5/run/summary.txt bench/gpu/summarize.py $R/gpu/h200_5/run
same $R/gpu/h200_5/torch/summary.txt bench/gpu/summarize_torch.py $R/gpu/h200_5/torch
runs $R/compression/summarize.py
runs $R/criteo/summarize.py
runs $R/criteo/read_ahead/summarize.py
runs $R/criteo_step/summarize.py
runs $R/small_rt/summarize.py
runs $R/threads/summarize.py $R/threads
runs $R/threads/summarize.py $R/threads/grain18
runs $R/checkpoints/ab/ck_analyze.py $R/checkpoints/ab
runs $R/nonfinite-ab/ab_analyze.py $R/nonfinite-ab
for d in pipeline2 pipeline3 pipeline4 torch_dlrm; do
  echo "no runs  $R/$d/summary.txt (its raw runs were never committed: checked by hand only)"
done
exit $fail
