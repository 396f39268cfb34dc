#!/usr/bin/env python3
"""The folder bench/results/paired/run.sh wrote, as text.

ps_paired/ benchmarks pair each Ferry call with a raw ZeroMQ call moving the same bytes (a push:
the tensor one way and an empty reply; a pull: an empty request and the tensor back; a push+pull:
both ways), in alternating order, between the same kind of processes. Per benchmark and round
ferry-bench records the median ms of each (ferry_ms, raw_ms), raw_ms / ferry_ms
(vs_raw_same_bytes: the share of raw's rate) and the median of the per-pair ratios (pair_median).
This prints, per call, the median (min-max) over rounds of each; then the 1 MiB calls at three
piece sizes. Output depends on the folder's files only.
  /usr/bin/python3 bench/results/paired/summarize.py bench/results/paired
"""
import glob
import json
import os
import re
import statistics
import sys

NAME = re.compile(r"^ps_paired/(?P<op>[a-z_]+)/tcp/(?P<size>[0-9]+[KM]iB)/1s1w")
SIZES = ["4KiB", "1MiB", "16MiB"]
OPS = ["push", "pull", "pull_view", "pushpull", "pushpull_view"]
KEYS = ["ferry_ms", "raw_ms", "vs_raw_same_bytes", "pair_median"]


def read(path):
    """{(op, size): {counter: value}} of one Google Benchmark JSON file; failed runs left out."""
    out = {}
    for b in json.load(open(path))["benchmarks"]:
        m = NAME.match(b["name"])
        if m and not b.get("error_occurred"):
            out[(m["op"], m["size"])] = {k: b[k] for k in KEYS}
    return out


def cell(values):
    if not values:
        return "-"
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def table(runs, sizes, title):
    print(title)
    print(f"{'call':24s} {'ferry ms':>22s} {'raw ms':>22s} {'raw / ferry (medians)':>22s} {'per-pair ratio':>22s}")
    for size in sizes:
        for op in OPS:
            got = [r[(op, size)] for r in runs if (op, size) in r]
            if got:
                print(f"{op + ' ' + size:24s}" + "".join(f" {cell([g[k] for g in got]):>22s}" for k in KEYS))


def main(folder):
    print(open(os.path.join(folder, "meta.txt")).read().rstrip())
    rounds = sorted(glob.glob(os.path.join(folder, "paired-r*.json")))
    print()
    table([read(p) for p in rounds], SIZES,
          f"Ferry paired with raw ZeroMQ moving the same bytes, 1 server 1 worker: median (min-max) over {len(rounds)} "
          "rounds of each round's medians")
    what = {"default": "the library's default: one message of two 512 KiB chunks",
            "256KiB": "chunks and messages of 256 KiB (4 messages)", "128KiB": "chunks and messages of 128 KiB (8)"}
    for cfg, text in what.items():
        runs = [read(p) for p in sorted(glob.glob(os.path.join(folder, f"pieces-{cfg}-r*.json")))]
        if runs:
            print()
            table(runs, ["1MiB"], f"1 MiB sent as {text}, {len(runs)} rounds (the order of the three rotating)")
    for arm, text in (("check", "as built"), ("nocheck", "with the push's NaN/Inf check skipped (nocheck.patch)")):
        runs = [read(p) for p in sorted(glob.glob(os.path.join(folder, f"{arm}-r*.json")))]
        if runs:
            print()
            table(runs, ["1MiB", "16MiB"], f"ferry-ps {text}, {len(runs)} rounds alternating with the other")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
