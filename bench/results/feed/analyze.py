#!/usr/bin/env python3
"""The change feed's bench (bench/feed_bench.cc): per mode, the median over rounds of the worker's
steps/s, of its ratio to the same round's "off" run, and of the staleness figures.

    python3 analyze.py run-10M.json
"""
import json
import statistics
import sys


def main(path):
    with open(path) as f:
        d = json.load(f)
    runs = d["runs"]
    off = {r["round"]: r["steps_per_s"] for r in runs if r["mode"] == "off"}
    load = d["initial_load"]
    if "poll_p50_s" not in runs[0]:
        sys.exit(f"{path}: an earlier format (no poll times or CPU): read its .log")
    print(f"rows {d['rows']} dim {d['dim']} batch {d['batch']}, {d['seconds']} s a run, {len(off)} rounds")
    print(f"initial load: {load['rows']} rows, {load['mb']:.0f} MB in {load['pages']} pages: poll {load['poll_s']:.2f} s "
          f"({load['mb'] / load['poll_s']:.0f} MB/s), apply to the copy {load['apply_s']:.2f} s")
    print("| mode | steps/s | / off (same round) | per round | poll ms | staleness after a poll p50 / max s | "
          "before a poll p50 / max s | process CPU / s | reader CPU / s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in ["off", "every-1000ms", "every-100ms", "continuous"]:
        rs = [r for r in runs if r["mode"] == mode]
        ratios = [r["steps_per_s"] / off[r["round"]] for r in rs]
        med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
        print(f"| {mode} | {med('steps_per_s'):.1f} | {statistics.median(ratios):.3f} | "
              f"{', '.join(f'{x:.3f}' for x in ratios)} | {1000 * med('poll_p50_s'):.1f} | "
              f"{med('staleness_p50_s'):.3f} / {max(r['staleness_max_s'] for r in rs):.3f} | "
              f"{med('peak_staleness_p50_s'):.3f} / {max(r['peak_staleness_max_s'] for r in rs):.3f} | "
              f"{med('process_cpu_s') / d['seconds']:.2f} | {med('reader_cpu_s') / d['seconds']:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "run-10M.json")
