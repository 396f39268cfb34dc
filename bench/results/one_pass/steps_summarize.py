#!/usr/bin/env python3
"""Recomputes steps/summary.txt from steps/steps-*.json (ferry-bench --benchmark_filter='^steps/'):
per size, a chunk's update then its reply copy (by_chunk_ms, as the server does it) against the
same in one pass (one_pass_ms), ms per call per run, and one_pass / by_chunk, median (min-max).
  /usr/bin/python3 bench/results/one_pass/steps_summarize.py [folder]
"""
import glob
import json
import os
import statistics
import sys


def main(folder):
    rows = {}
    for path in sorted(glob.glob(os.path.join(folder, "steps", "steps-*.json"))):
        for b in json.load(open(path))["benchmarks"]:
            rows.setdefault(b["name"].split("/iterations")[0], []).append((b["by_chunk_ms"], b["one_pass_ms"]))
    print("benchmark | runs | by_chunk ms median (min-max) | one_pass ms | one_pass / by_chunk per run")
    for name in sorted(rows):
        v = rows[name]
        cell = lambda xs: f"{statistics.median(xs):.4f} ({min(xs):.4f}-{max(xs):.4f})"  # noqa: E731
        ratios = [o / c for c, o in v]
        print(f"{name} | {len(v)} | {cell([c for c, _ in v])} | {cell([o for _, o in v])} | "
              f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
