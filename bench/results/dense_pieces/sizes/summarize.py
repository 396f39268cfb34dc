#!/usr/bin/env python3
"""The piece-size experiment (bench/results/dense_pieces/README.md, "Which size"): per benchmark
and configuration, the median (min-max) milliseconds a call over the rounds, and today's (c4m)
median over each configuration's.
  python3 bench/results/dense_pieces/sizes/summarize.py bench/results/dense_pieces/sizes
"""
import glob
import json
import os
import statistics
import sys

CONFIGS = [  # name, what it is
    ("c4m", "4 MiB chunks, one message per server (1.8's defaults)"),
    ("m4m", "4 MiB chunks, one chunk a message"),
    ("c2m", "2 MiB chunks, one chunk a message"),
    ("c1m", "1 MiB chunks, one chunk a message"),
    ("c256k", "256 KiB chunks, one chunk a message"),
]


def main(folder):
    times = {}
    for path in sorted(glob.glob(os.path.join(folder, "*-*.json"))):
        config = os.path.basename(path).rsplit("-", 1)[0]
        for b in json.load(open(path))["benchmarks"]:
            name = b["name"].split("/iterations")[0]
            times.setdefault(name, {}).setdefault(config, []).append(b["real_time"])
    for name, what in CONFIGS:
        print(f"{name}: {what}")
    print()
    print("benchmark | " + " | ".join(f"{c} ms" for c, _ in CONFIGS) + " | " +
          " | ".join(f"c4m / {c}" for c, _ in CONFIGS[1:]))
    for bench in sorted(times):
        row = times[bench]
        med = {c: statistics.median(row[c]) for c, _ in CONFIGS}
        cells = [f"{med[c]:.3f} ({min(row[c]):.3f}-{max(row[c]):.3f}) n={len(row[c])}" for c, _ in CONFIGS]
        ratios = [f"{med['c4m'] / med[c]:.3f}" for c, _ in CONFIGS[1:]]
        print(f"{bench} | " + " | ".join(cells) + " | " + " | ".join(ratios))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
