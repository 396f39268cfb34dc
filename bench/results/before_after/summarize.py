#!/usr/bin/env python3
"""Recomputes bench/results/HISTORY.md "Before and after this stop" from before-R.json and after-R.json:
per benchmark the median (min-max) real time a call over the rounds of each binary, after /
before of the medians, and whether the two ranges are apart (a change beyond this machine's noise).
  python3 bench/results/before_after/summarize.py [bench/results/before_after]
"""
import glob
import json
import os
import re
import statistics
import sys

def read_times(path):
    """One ferry-bench JSON file: {benchmark name (iterations/real_time/threads dropped): seconds a call}."""
    times = {}
    with open(path) as f:
        for b in json.load(f)["benchmarks"]:
            if b.get("run_type") != "iteration" or "error_occurred" in b:
                continue
            name = re.sub(r"/iterations:\d+|/real_time|/threads:\d+", "", b["name"])
            scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]
            times[name] = b["real_time"] * scale
    return times


def load(root, which):
    times = {}
    for path in sorted(glob.glob(os.path.join(root, f"{which}-*.json"))):
        for name, t in read_times(path).items():
            times.setdefault(name, []).append(t)
    return times


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    before, after = load(root, "before"), load(root, "after")
    print("benchmark | rounds | before ms median (min-max) | after ms median (min-max) | after / before | ranges apart")
    for name in sorted(set(before) & set(after)):
        b, a = before[name], after[name]
        mb, ma = statistics.median(b), statistics.median(a)
        apart = "slower" if min(a) > max(b) else "faster" if max(a) < min(b) else ""
        print(f"{name} | {len(b)}/{len(a)} | {mb * 1e3:.4f} ({min(b) * 1e3:.4f}-{max(b) * 1e3:.4f}) | "
              f"{ma * 1e3:.4f} ({min(a) * 1e3:.4f}-{max(a) * 1e3:.4f}) | {ma / mb:.3f} | {apart}")


if __name__ == "__main__":
    main()
