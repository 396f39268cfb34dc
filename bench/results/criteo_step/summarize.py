"""Recomputes every figure of RESULTS.md's "A Criteo-shaped step" from run.json.

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
print("| op | servers | one message: M unique rows/s (min-max) | per table: M unique rows/s (min-max) | one / per table | messages a step (one, per table) | one message: wire bytes/s vs raw/tcp/1MiB |")
print("|---|---:|---:|---:|---:|---:|---:|")
for op in ("pull", "push"):
    for servers in (1, 2):
        one = "criteo_step/%s/one_message/%ds1w" % (op, servers)
        per = "criteo_step/%s/per_table/%ds1w" % (op, servers)
        o, p = values(one, "unique_rows_per_second"), values(per, "unique_rows_per_second")
        mo, mp = statistics.median(o), statistics.median(p)
        print("| %s | %d | %.2f (%.2f-%.2f) | %.2f (%.2f-%.2f) | %.3f | %.0f, %.0f | %.3f |" % (
            op, servers, mo / 1e6, min(o) / 1e6, max(o) / 1e6, mp / 1e6, min(p) / 1e6, max(p) / 1e6, mo / mp,
            med(one, "messages_per_step"), med(per, "messages_per_step"), mo * ROW_BYTES / raw["1MiB"]))
print()
print("| op | servers | process CPU ms a step: one message, per table | calling thread CPU ms a step: one message, per table |")
print("|---|---:|---:|---:|")
for op in ("pull", "push"):
    for servers in (1, 2):
        one = "criteo_step/%s/one_message/%ds1w" % (op, servers)
        per = "criteo_step/%s/per_table/%ds1w" % (op, servers)
        print("| %s | %d | %.2f, %.2f | %.3f, %.3f |" % (
            op, servers, med(one, "process_cpu_ms_per_step"), med(per, "process_cpu_ms_per_step"),
            med(one, "caller_cpu_ms_per_step"), med(per, "caller_cpu_ms_per_step")))
print()
print("unique rows a step: %.0f" % med("criteo_step/pull/one_message/1s1w", "unique_per_step"))
print()
print("| optimizer | raw bytes a row | heap bytes a row at 1M / 1.5M / 2M / 3M rows | heap / raw |")
print("|---|---:|---:|---:|")
for opt in ("sgd", "adagrad", "adam"):
    names = ["mem/sparse_row/%s/%d" % (opt, n) for n in (1000000, 1500000, 2000000, 3000000)]
    heap = [med(n, "heap_bytes_per_row") for n in names]
    rawb = med(names[0], "raw_bytes_per_row")
    print("| %s | %.0f | %s | %s |" % (opt, rawb, " / ".join("%.1f" % h for h in heap),
                                      " / ".join("%.2f" % (h / rawb) for h in heap)))
