"""Recomputes bench/results/HISTORY.md "Where a 4 KiB push+pull spends its syscalls" from the files here.

    python3 bench/results/small_rt/summarize.py

strace_*.txt: `strace -c -f -o FILE ferry-bench --benchmark_filter=F`, client and server threads
together, for F = '^raw/tcp/4KiB/', '^raw(_chunked)?/tcp/4KiB/' and '^ps/pushpull/tcp/4KiB/1s1w'.
Each benchmark makes 2,200 round trips (200 warm-up calls and 2,000 timed; WarmupCalls in
bench/ferry_bench.cc). The ps run also measures its two baselines, raw/ and raw_chunked/ (one
4 KiB frame each), in the same process: its own calls are its file's less those of the
raw-and-chunked run. Connection set-up adds a few calls. time.json: the two benchmarks' times,
3 repetitions, without strace.
"""
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
ROUND_TRIPS = 2200


def calls(name):
    out = {}
    for line in open(os.path.join(HERE, name)):
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1].isidentifier():
            out[parts[-1]] = int(parts[3])
    return out


raw = calls("strace_raw_tcp_4KiB.txt")
ps_run, baselines = calls("strace_ps_pushpull_tcp_4KiB_1s1w.txt"), calls("strace_raw_and_chunked_tcp_4KiB.txt")
ps = {k: ps_run.get(k, 0) - baselines.get(k, 0) for k in set(ps_run) | set(baselines) if k != "total"}
raw.pop("total", None)
print("| syscall | raw/tcp/4KiB a round trip | ps/pushpull/tcp/4KiB/1s1w a round trip | ps / raw |")
print("|---|---:|---:|---:|")
keys = sorted(set(raw) | set(ps), key=lambda k: -ps.get(k, 0))
total_raw = total_ps = 0.0
for k in keys:
    r, p = raw.get(k, 0) / ROUND_TRIPS, ps.get(k, 0) / ROUND_TRIPS
    if max(r, p) < 0.5:
        continue
    total_raw += r
    total_ps += p
    print("| %s | %.1f | %.1f | %s |" % (k, r, p, "%.2f" % (p / r) if r >= 0.05 else "-"))
print("| all of the above | %.1f | %.1f | %.2f |" % (total_raw, total_ps, total_ps / total_raw))
runs = [b for b in json.load(open(os.path.join(HERE, "time.json")))["benchmarks"] if b.get("run_type") == "iteration"]
t = {}
for b in runs:
    t.setdefault(b["run_name"].split("/iterations")[0], []).append(b["real_time"])
for k, v in sorted(t.items()):
    print("%s: median %.1f us a round trip (%.1f-%.1f)" % (k, statistics.median(v), min(v), max(v)))
r, p = statistics.median(t["raw/tcp/4KiB"]), statistics.median(t["ps/pushpull/tcp/4KiB/1s1w"])
print("ps / raw time: %.3f; raw / ps (the 'vs_raw' ratio): %.3f" % (p / r, r / p))
