#!/bin/sh
# Re-takes run.json (bench/results/HISTORY.md, "Gradient compression (issue 17)"): the codec/* and wire/* cases
# of ferry-bench, 3 repetitions, randomly interleaved (the machine is shared), from a build in
# build-c; then fashion_mnist.txt (the compressed training runs' lines). summarize.py reads them.
set -e
here=$(dirname "$0")
build=${1:-build-c}
"$build/bench/ferry-bench" --benchmark_filter='^(codec|wire)/' --benchmark_enable_random_interleaving=true \
  --benchmark_repetitions=3 --benchmark_out="$here/run.json" --benchmark_out_format=json >"$here/run.log" 2>&1
"$build/tests/cluster/trainer/trainer_fashion_mnist_test" --gtest_filter='Consistency/*sync:Wire/*' 2>&1 |
  grep -E "steps x|^\[  PASSED|^\[  FAILED" >"$here/fashion_mnist.txt"
python3 "$here/summarize.py" "$here/run.json"
