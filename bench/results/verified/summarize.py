#!/usr/bin/env python3
"""The folder bench/results/verified/run.sh wrote, as text: per ps_paired/ call, each server's
share of raw ZeroMQ moving the same bytes (raw_ms / ferry_ms of the round's medians) and its
per-pair median ratio, median (min-max) over rounds; then the changed server's speed over the one
before (before ferry_ms / after ferry_ms, round by round). Output depends on the folder's files.
  /usr/bin/python3 bench/results/verified/summarize.py bench/results/verified
"""
import glob
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "paired"))
from summarize import OPS, SIZES, cell, read  # noqa: E402


def main(folder):
    print(open(os.path.join(folder, "meta.txt")).read().rstrip())
    runs = {}
    for arm in ("before", "after"):
        for path in sorted(glob.glob(os.path.join(folder, f"{arm}-r*.json"))):
            r = int(os.path.basename(path)[len(arm) + 2:-5])
            runs.setdefault(arm, {})[r] = read(path)
    rounds = sorted(set(runs["before"]) & set(runs["after"]))
    print(f"\n{len(rounds)} rounds, the two servers alternating (which first drawn each round)")
    print(f"{'call':22s} {'before: raw / ferry':>22s} {'after: raw / ferry':>22s} {'before pair ratio':>22s} "
          f"{'after pair ratio':>22s} {'after speed / before':>22s}   per round")
    for size in SIZES:
        for op in OPS:
            key = (op, size)
            rs = [r for r in rounds if key in runs["before"][r] and key in runs["after"][r]]
            if not rs:
                continue
            b = [runs["before"][r][key] for r in rs]
            a = [runs["after"][r][key] for r in rs]
            speed = [x["ferry_ms"] / y["ferry_ms"] for x, y in zip(b, a)]
            print(f"{op + ' ' + size:22s} {cell([x['vs_raw_same_bytes'] for x in b]):>22s} "
                  f"{cell([x['vs_raw_same_bytes'] for x in a]):>22s} {cell([x['pair_median'] for x in b]):>22s} "
                  f"{cell([x['pair_median'] for x in a]):>22s} {cell(speed):>22s}   "
                  + " ".join(f"{x:.3f}" for x in speed))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
