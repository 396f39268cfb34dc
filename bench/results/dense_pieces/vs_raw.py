#!/usr/bin/env python3
"""Each binary's calls as a share of raw ZeroMQ in the same run: ferry-bench's `vs_raw` counter
(the call's payload rate over the rate of raw_proc/tcp of the same size, an echo between two
processes, measured in the same binary run), median (min-max) over the rounds, per binary.
  python3 bench/results/dense_pieces/vs_raw.py bench/results/dense_pieces
"""
import glob
import json
import os
import statistics
import sys


def main(folder):
    shares = {}
    for path in sorted(glob.glob(os.path.join(folder, "*-*.json"))):
        which = os.path.basename(path).split("-")[0]
        for b in json.load(open(path))["benchmarks"]:
            if "vs_raw" in b:
                shares.setdefault(b["name"].split("/iterations")[0], {}).setdefault(which, []).append(b["vs_raw"])
    print("benchmark | before: share of raw, median (min-max) | after | after / before")
    for bench in sorted(shares):
        row = shares[bench]
        cells = []
        for which in ("before", "after"):
            v = row[which]
            cells.append(f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})")
        ratio = statistics.median(row["after"]) / statistics.median(row["before"])
        print(f"{bench} | {cells[0]} | {cells[1]} | {ratio:.3f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
