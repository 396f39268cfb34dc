"""Recomputes every figure of bench/results/HISTORY.md's "A Criteo-shaped step" from run.json.

    python3 bench/results/criteo_step/summarize.py [run.json]

run.json is ferry-bench's --benchmark_out of
    ferry-bench --benchmark_filter='^criteo_step|^raw/tcp/(1MiB|16MiB)/|^mem/sparse_row' \
        --benchmark_repetitions=3 --benchmark_enable_random_interleaving=true
"""
import json
import os
import statistics
import sys

path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "run.json")
with open(path) as f:
    doc = json.load(f)
runs = [b for b in doc["benchmarks"] if b.get("run_type") == "iteration"]


def values(name, counter):
    got = [b[counter] for b in runs if b["run_name"].split("/iterations")[0] == name]
    if not got:
        raise SystemExit("no runs of " + name)
    return got


def med(name, counter):
    return statistics.median(values(name, counter))


# A pulled or pushed row moves its 8-byte id one way and its 16 floats (64 bytes) one way.
ROW_BYTES = 8 + 16 * 4
raw = {size: med("raw/tcp/" + size, "bytes_per_second") for size in ("1MiB", "16MiB")}
print("raw/tcp round trip, bytes/s: 1MiB %.2f GB/s, 16MiB %.2f GB/s" % (raw["1MiB"] / 1e9, raw["16MiB"] / 1e9))
print()
PATHS = ("one_message", "together", "per_table")
print("| op | servers | " + " | ".join("%s: M unique rows/s (min-max)" % p for p in PATHS) +
      " | together / per table | one message / per table | messages a step (" + ", ".join(PATHS) +
      ") | together: wire bytes/s vs raw/tcp/1MiB |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for op in ("pull", "push"):
    for servers in (1, 2):
        names = {p: "criteo_step/%s/%s/%ds1w" % (op, p, servers) for p in PATHS}
        v = {p: values(names[p], "unique_rows_per_second") for p in PATHS}
        m = {p: statistics.median(v[p]) for p in PATHS}
        cells = ["%.2f (%.2f-%.2f)" % (m[p] / 1e6, min(v[p]) / 1e6, max(v[p]) / 1e6) for p in PATHS]
        print("| %s | %d | %s | %.3f | %.3f | %s | %.3f |" % (
            op, servers, " | ".join(cells), m["together"] / m["per_table"], m["one_message"] / m["per_table"],
            ", ".join("%.0f" % med(names[p], "messages_per_step") for p in PATHS),
            m["together"] * ROW_BYTES / raw["1MiB"]))
print()
print("| op | servers | process CPU ms a step (" + ", ".join(PATHS) + ") | calling thread CPU ms a step (" + ", ".join(PATHS) + ") |")
print("|---|---:|---:|---:|")
for op in ("pull", "push"):
    for servers in (1, 2):
        names = ["criteo_step/%s/%s/%ds1w" % (op, p, servers) for p in PATHS]
        print("| %s | %d | %s | %s |" % (op, servers, ", ".join("%.2f" % med(n, "process_cpu_ms_per_step") for n in names),
                                        ", ".join("%.3f" % med(n, "caller_cpu_ms_per_step") for n in names)))
print()
print("unique rows a step: %.0f" % med("criteo_step/pull/together/1s1w", "unique_per_step"))
for op in ("pull", "push"):
    n = "sparse/%s/dim16" % op
    print("%s (one table, 100k Zipf ids a call): %.2f M requested rows/s, %.2f M unique rows/s" % (
        n, med(n, "rows_per_second") / 1e6, med(n, "unique_rows_per_second") / 1e6))
print()
print("| optimizer | raw bytes a row | heap bytes a row at 1M / 1.5M / 2M / 3M rows | heap / raw |")
print("|---|---:|---:|---:|")
for opt in ("sgd", "adagrad", "adam"):
    names = ["mem/sparse_row/%s/%d" % (opt, n) for n in (1000000, 1500000, 2000000, 3000000)]
    heap = [med(n, "heap_bytes_per_row") for n in names]
    rawb = med(names[0], "raw_bytes_per_row")
    print("| %s | %.0f | %s | %s |" % (opt, rawb, " / ".join("%.1f" % h for h in heap),
                                      " / ".join("%.2f" % (h / rawb) for h in heap)))
