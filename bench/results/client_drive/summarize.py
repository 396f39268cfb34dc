#!/usr/bin/env python3
"""Recomputes bench/results/HISTORY.md "The caller reads its own replies" from before-R.json / after-R.json
(run.sh: the ferry-bench of b8f6fcb and of d9f4782 alternating, ROUNDS rounds).

Per round and binary, Ferry's payload rate over the raw ZeroMQ round trip's measured in the same
binary run (a push or a pull moves the tensor once, a push+pull and a raw round trip twice, so
ratio = raw time / (2 x push time) for a push or pull, raw time / push+pull time for a push+pull);
then the median and range over the rounds. Between processes: ps_proc/ against raw_proc/; in one
process: ps/ (1 server, 1 worker) against raw/.
  python3 bench/results/client_drive/summarize.py [dir]
"""
import glob
import os
import statistics
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the results
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "before_after"))
from summarize import read_times  # noqa: E402  (one ferry-bench JSON file: name -> seconds a call)

root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))


def rounds(which):
    return [read_times(path) for path in sorted(glob.glob(os.path.join(root, f"{which}-*.json")))]


def fmt(xs):
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


print("size | placement | op | before: ratio to raw, median (min-max) | after | after / before of the medians")
for size in ("4KiB", "16MiB"):
    for placement, raw, ps in (("processes", f"raw_proc/tcp/{size}", "ps_proc/{op}/tcp/" + size + "/1s1w"),
                               ("one process", f"raw/tcp/{size}", "ps/{op}/tcp/" + size + "/1s1w")):
        for op in ("push", "pull", "pushpull"):
            name = ps.format(op=op)
            cols = []
            for which in ("before", "after"):
                rs = [r for r in rounds(which) if name in r and raw in r]
                cols.append([r[raw] / (r[name] * (1 if op == "pushpull" else 2)) for r in rs])
            if not cols[0] or not cols[1]:
                continue
            print(f"{size} | {placement} | {op} | {fmt(cols[0])} | {fmt(cols[1])} | "
                  f"{statistics.median(cols[1]) / statistics.median(cols[0]):.3f}")
