"""Recomputes bench/results/HISTORY.md "The server's helper threads" from threads-<t>-round-<r>.json.

    python3 bench/results/threads/summarize.py [folder]
"""
import glob
import json
import os
import statistics
import sys

folder = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
runs = {}  # (threads, name) -> [(metric, value)]
for path in sorted(glob.glob(os.path.join(folder, "threads-*-round-*.json"))):
    threads = int(os.path.basename(path).split("-")[1])
    for b in json.load(open(path))["benchmarks"]:
        name = b["run_name"].split("/iterations")[0]
        if name.startswith("criteo_step"):
            value, unit = b["unique_rows_per_second"] / 1e6, "M unique rows/s"
        else:
            value, unit = b["real_time"], "us a call" if b["time_unit"] == "us" else b["time_unit"] + " a call"
            if b["time_unit"] == "ms":
                value, unit = value * 1e3, "us a call"
        runs.setdefault((threads, name), []).append((unit, value))
names = sorted({n for _, n in runs})
print("| benchmark | unit | no helper (0): median (min-max) | one helper (1): median (min-max) | 1 helper / none |")
print("|---|---|---:|---:|---:|")
for n in names:
    cells = []
    meds = []
    unit = runs[(0, n)][0][0]
    for t in (0, 1):
        v = [x for _, x in runs[(t, n)]]
        meds.append(statistics.median(v))
        cells.append("%.2f (%.2f-%.2f)" % (statistics.median(v), min(v), max(v)))
    print("| %s | %s | %s | %s | %.3f |" % (n, unit, cells[0], cells[1], meds[1] / meds[0]))
