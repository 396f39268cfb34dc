#!/usr/bin/env python3
"""Recomputes bench/results/HISTORY.md "Where a 16 MiB push+pull spends its time" from run-R.json: per
round, the raw round trip between processes (raw_proc), Ferry's push+pull against a ferry-ps
process (ps_proc), their difference (what Ferry adds to the transport), and the steps Ferry does
beside the transport, each timed apart on one thread (steps/pushpull/16MiB counters), with their
sum; then medians (min-max) over the rounds.
  /usr/bin/python3 bench/results/pushpull16/summarize.py [bench/results/pushpull16]
"""
import glob
import json
import os
import statistics
import sys

STEPS = ["check_ms", "update_ms", "reply_ms", "client_copy_ms"]


def read(path):
    out = {}
    with open(path) as f:
        for b in json.load(f)["benchmarks"]:
            if b.get("run_type") != "iteration" or "error_occurred" in b:
                continue
            assert b["time_unit"] == "ms", b["name"]
            name = b["name"].split("/iterations")[0]
            out[name] = b
    return out


def fmt(values):
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    rows = []
    for path in sorted(glob.glob(os.path.join(root, "run-*.json"))):
        b = read(path)
        raw = b["raw_proc/tcp/16MiB"]["real_time"]
        ferry = b["ps_proc/pushpull/tcp/16MiB/1s1w"]["real_time"]
        steps = b["steps/pushpull/16MiB"]
        row = {"raw ms": raw, "ferry ms": ferry, "ferry / raw (rate)": raw / ferry, "ferry - raw ms": ferry - raw}
        for s in STEPS:
            row[s] = steps[s]
        row["steps sum ms"] = sum(steps[s] for s in STEPS)
        row["steps sum / (ferry - raw)"] = row["steps sum ms"] / (ferry - raw)
        row["faults per call (steps)"] = steps["faults_per_call"]
        rows.append(row)
    print(f"rounds: {len(rows)}; median (min-max) over the rounds")
    for key in rows[0]:
        print(f"{key}: {fmt([r[key] for r in rows])}")


if __name__ == "__main__":
    main()
