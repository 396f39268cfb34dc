#!/usr/bin/env python3
"""Recomputes bench/results/HISTORY.md "Before and after --push-by-layer, the default path" from
before/runs and after/runs (bench/results/pipeline/run.sh's metrics files): per configuration the
job's examples/s after / before per round, median (min-max), and whether the ranges of the two
binaries' examples/s are apart.
  /usr/bin/python3 bench/results/pipeline_ab/summarize.py [bench/results/pipeline_ab]
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pipeline"))
from summarize import fmt, load, per_run  # noqa: E402


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    before, after = load(os.path.join(root, "before")), load(os.path.join(root, "after"))
    print("model mode pipeline workers | rounds | before examples/s | after examples/s | after / before per round | ranges apart")
    for key in sorted(set(before) & set(after)):
        rounds = sorted(set(before[key]) & set(after[key]))
        b = [per_run(before[key][r])["eps"] for r in rounds]
        a = [per_run(after[key][r])["eps"] for r in rounds]
        apart = "slower" if max(a) < min(b) else "faster" if min(a) > max(b) else ""
        print(f"{' '.join(map(str, key))} | {len(rounds)} | {fmt(b, 0)} | {fmt(a, 0)} | "
              f"{fmt([x / y for x, y in zip(a, b)], 3)} | {apart}")


if __name__ == "__main__":
    main()
