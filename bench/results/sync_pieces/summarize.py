#!/usr/bin/env python3
"""Recomputes summary.txt from before/ and after/ (bench/results/pipeline/run.sh's metrics files):
per configuration each binary's examples/s, median (min-max) over the rounds, and after / before
per round, median (min-max).
  /usr/bin/python3 bench/results/sync_pieces/summarize.py [folder]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pipeline"))
from summarize import fmt, load, per_run  # noqa: E402


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    runs = {w: load(os.path.join(root, w)) for w in ("before", "after")}
    print("model mode pipeline workers | rounds | before examples/s | after | after / before per round")
    for key in sorted(set(runs["before"]) & set(runs["after"])):
        rounds = sorted(set(runs["before"][key]) & set(runs["after"][key]))
        eps = {w: [per_run(runs[w][key][r])["eps"] for r in rounds] for w in runs}
        ratio = fmt([a / b for a, b in zip(eps["after"], eps["before"])], 3)
        print(f"{' '.join(map(str, key))} | {len(rounds)} | {fmt(eps['before'], 0)} | {fmt(eps['after'], 0)} | {ratio}")


if __name__ == "__main__":
    main()
