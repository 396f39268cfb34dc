#!/usr/bin/env python3
"""Turns ferry-bench JSON output into the Markdown tables of bench/RESULTS.md.

    build/bench/ferry-bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
        --benchmark_out=results.json --benchmark_out_format=json
    bench/results_table.py results.json

Uses the `median` aggregate of each benchmark (or the plain run when there are no repetitions).
Rates are printed in GB/s (1e9 bytes) and M rows/s; times per call are per worker (Google
Benchmark divides a multi-threaded run's time by all threads' iterations; this multiplies back).
"""
import json
import sys


def load(path):
    with open(path) as f:
        doc = json.load(f)
    runs = {}
    for b in doc["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        name = b["run_name"]
        # A median beats a plain run of the same benchmark.
        if name not in runs or b.get("aggregate_name") == "median":
            runs[name] = b
    return doc.get("context", {}), runs


def base(run_name):
    """'ps/push/tcp/4KiB/1s1w/iterations:2000/real_time/threads:1' -> 'ps/push/tcp/4KiB/1s1w'."""
    harness = ("iterations:", "real_time", "threads:")
    return "/".join(p for p in run_name.split("/") if not p.startswith(harness))


def ms_per_call(b):
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
    return b["real_time"] * scale * b.get("threads", 1)


def fmt_time(ms):
    return f"{ms * 1000:.0f} µs" if ms < 1 else f"{ms:.2f} ms" if ms < 100 else f"{ms:.0f} ms"


def gbs(b, key="bytes_per_second"):
    return f"{b[key] / 1e9:.2f}" if key in b else "–"


def ratio(b, key):
    return f"{b[key]:.2f}" if key in b else "–"


def faults(b):
    v = b.get("faults_per_call")
    return "–" if v is None else f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def main(path):
    _, runs = load(path)
    by = {base(k): v for k, v in runs.items()}

    print("### Raw ZeroMQ round trip (payload bytes both ways)\n")
    print("| benchmark | time / round trip | GB/s | page faults / call |")
    print("|---|---:|---:|---:|")
    for name, b in by.items():
        if name.startswith("raw"):
            print(f"| `{name}` | {fmt_time(ms_per_call(b))} | {gbs(b)} | {faults(b)} |")

    print("\n### PS dense push / pull / push+pull (same byte accounting)\n")
    print("| op | net | size | servers/workers | time / call (per worker) | GB/s (all workers) | vs_raw | "
          "vs_raw_chunked | page faults / call |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|")
    for name, b in by.items():
        if name.startswith("ps/"):
            _, op, net, size, topo = name.split("/")
            print(f"| {op} | {net} | {size} | {topo} | {fmt_time(ms_per_call(b))} | {gbs(b)} | "
                  f"{ratio(b, 'vs_raw')} | {ratio(b, 'vs_raw_chunked')} | {faults(b)} |")

    print("\n### Many small tensors (100 x 1 KiB, push+pull, tcp)\n")
    print("| mode | servers | time / step | round trips / step | GB/s | vs raw_frames/tcp/100x1KiB |")
    print("|---|---|---:|---:|---:|---:|")
    for name, b in by.items():
        if name.startswith("small/"):
            _, mode, topo = name.split("/")
            print(f"| {mode} | {topo} | {fmt_time(ms_per_call(b))} | {b['round_trips_per_step']:.0f} | {gbs(b)} | "
                  f"{ratio(b, 'vs_raw')} |")

    print("\n### Sparse, 100k Zipf ids per call, 1 server, tcp\n")
    print("| op | dim | time / call | requested rows/s | unique rows/s | unique ids / batch | caller CPU / call |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, b in by.items():
        if name.startswith("sparse/"):
            _, op, dim = name.split("/")
            scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
            print(f"| {op} | {dim[3:]} | {fmt_time(ms_per_call(b))} | {b['rows_per_second'] / 1e6:.1f} M | "
                  f"{b['unique_rows_per_second'] / 1e6:.1f} M | {b['unique_per_batch']:.0f} | "
                  f"{fmt_time(b['cpu_time'] * scale)} |")

    print("\n### Memory bandwidth and optimizer apply (16M elements, one thread)\n")
    print("| benchmark | time / pass | GB/s of memory traffic | vs_stream (triad) | vs_axpy |")
    print("|---|---:|---:|---:|---:|")
    for name, b in by.items():
        if name.startswith(("mem/", "opt/")) and "us_per_page" not in b:
            print(f"| `{name}` | {fmt_time(ms_per_call(b))} | {gbs(b)} | {ratio(b, 'vs_stream')} | "
                  f"{ratio(b, 'vs_axpy')} |")
    for name, b in by.items():
        if "us_per_page" in b:
            print(f"\n`{name}`: {fmt_time(ms_per_call(b))} per 64 MiB, {b['us_per_page']:.2f} µs per page, "
                  f"{faults(b)} page faults per call.")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
