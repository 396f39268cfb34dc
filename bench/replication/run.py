#!/usr/bin/env python3
"""What replication factor 2 costs a push (issue 38, protocol 1.21 "Replicas"), in one run.

Each round starts two ferry-ps processes on 127.0.0.1 with --replication 1, then two with
--replication 2 (each server forwarding every update it applies to the other, and answering the
push once the other has applied it), in the order that alternates by round, and against each pair
runs bench/ferry-client-bench (separate processes, as users run them; every table async):
  - one client: the time of one push (or pull), submitted and waited for: dense 4 KiB, 1 MiB and
    16 MiB (tables split over both servers), sparse 100,000 distinct ids of dim 16;
  - two clients at once (ranks 0 and 1), pushes only: their aggregate bytes/s (payload bytes:
    dense floats, sparse ids and rows), and the servers' CPU seconds (user + system, from /proc)
    per GB pushed in that phase.
The pulls are the control: replication does not touch them. Prints, per operation, the median
over the rounds of each factor and their ratio (factor 2 / factor 1), and writes every round's
numbers to --out (JSON).

  python3 bench/replication/run.py --build-dir build [--rounds 5] [--min-time 0.5] [--ps-threads 1] --out FILE
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys

LATENCY = ["BM_PushDense/1024", "BM_PushDense/262144", "BM_PushDense/4194304", "BM_PushSparseDistinct",
           "BM_PullDense/262144", "BM_PullDense/4194304", "BM_PullSparseDistinct"]
THROUGHPUT = ["BM_PushDense/262144", "BM_PushDense/4194304", "BM_PushSparseDistinct"]
SPARSE_IDS, DIM = 100000, 16


def payload_bytes(name):
    """Bytes one call of benchmark `name` carries: dense floats; sparse ids and rows."""
    if "Sparse" in name:
        return SPARSE_IDS * (8 + DIM * 4)
    return int(name.split("/")[1]) * 4


def cpu_seconds(procs):
    """User + system CPU seconds the processes have used so far (/proc/PID/stat)."""
    total = 0
    for p in procs:
        with open(f"/proc/{p.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start_servers(build, factor, workers, threads):
    ports = free_ports(2)
    peers = ",".join(f"tcp://127.0.0.1:{p}" for p in ports)
    procs = []
    for rank, port in enumerate(ports):
        argv = [os.path.join(build, "bin", "ferry-ps"), "--bind", f"tcp://127.0.0.1:{port}", "--rank", str(rank),
                "--num-servers", "2", "--num-workers", str(workers), "--compute-threads", str(threads)]
        if factor == 2:
            argv += ["--replication", "2", "--peers", peers]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        line = p.stdout.readline()
        if "listening" not in line:
            sys.exit(f"ferry-ps did not start: {line}{p.stdout.read()}")
    return procs, peers


def stop(procs):
    out = []
    for p in procs:
        p.terminate()
    for p in procs:
        out.append(p.communicate(timeout=30)[0])
    return out


def client_bench(build, servers, names, min_time, rank=0, workers=1):
    pattern = "^(" + "|".join(re.escape(n) for n in names) + ")/real_time$"
    return subprocess.Popen([os.path.join(build, "bench", "ferry-client-bench"), f"--servers={servers}",
                             f"--rank={rank}", f"--num-workers={workers}", f"--table-prefix=r{rank}_",
                             f"--benchmark_filter={pattern}", "--benchmark_format=json",
                             f"--benchmark_min_time={min_time}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def results(proc):
    out, err = proc.communicate(timeout=900)
    if proc.returncode != 0:
        sys.exit(f"ferry-client-bench failed ({proc.returncode}): {err}")
    got = {}
    for b in json.loads(out)["benchmarks"]:
        if "error_occurred" in b:
            sys.exit(f"{b['name']}: {b.get('error_message')}")
        name = b["name"].removesuffix("/real_time")
        got[name] = {"us": b["real_time"] * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[b["time_unit"]],
                     "iterations": b["iterations"]}
    return got


def one(build, factor, min_time, threads):
    """One factor: the latencies of one client, then the throughput of two at once."""
    procs, servers = start_servers(build, factor, workers=2, threads=threads)
    try:
        single = results(client_bench(build, servers, LATENCY, min_time, rank=0, workers=2))
        cpu_before = cpu_seconds(procs)
        pair = [client_bench(build, servers, THROUGHPUT, min_time, rank=r, workers=2) for r in (0, 1)]
        both = [results(p) for p in pair]
        cpu = cpu_seconds(procs) - cpu_before
    finally:
        logs = stop(procs)
    summary = [line for log in logs for line in log.splitlines() if "replicas:" in line]
    pushed = sum(b[k]["iterations"] * payload_bytes(k) for b in both for k in THROUGHPUT)
    return {"latency_us": {k: v["us"] for k, v in single.items()},
            # The two clients' calls per second (each its iterations over its time), added.
            "throughput_Bps": {k: sum(payload_bytes(k) * 1e6 / b[k]["us"] for b in both) for k in THROUGHPUT},
            "servers_cpu_s_per_GB_pushed": cpu / (pushed / 1e9),
            "servers_said": summary}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ps-threads", type=int, default=1, help="each ferry-ps's --compute-threads (default 1)")
    a = ap.parse_args()
    build = os.path.abspath(a.build_dir)
    rounds = []
    for r in range(a.rounds):
        order = (1, 2) if r % 2 == 0 else (2, 1)
        got = {}
        for factor in order:
            got[factor] = one(build, factor, a.min_time, a.ps_threads)
            print(f"round {r + 1}/{a.rounds} factor {factor}: " +
                  ", ".join(f"{k} {v:.0f} us" for k, v in got[factor]["latency_us"].items()), flush=True)
        rounds.append({"order": list(order), "factor1": got[1], "factor2": got[2]})
    machine = subprocess.run(["uname", "-srm"], capture_output=True, text=True).stdout.strip()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    print(f"\n{a.rounds} rounds, medians (factor 2 / factor 1; each round's ratio in brackets)")
    for x in rounds:  # (one row of its own)
        for f in ("factor1", "factor2"):
            x[f]["cpu"] = {"servers": x[f]["servers_cpu_s_per_GB_pushed"]}
    for key, unit, scale in (("latency_us", "us", 1.0), ("throughput_Bps", "MB/s", 1e-6), ("cpu", "s/GB", 1.0)):
        for name in rounds[0]["factor1"][key]:
            f1 = [x["factor1"][key][name] * scale for x in rounds]
            f2 = [x["factor2"][key][name] * scale for x in rounds]
            each = " ".join(f"{b / a_:.2f}" for a_, b in zip(f1, f2))
            print(f"{key.split('_')[0]:10} {name:24} factor1 {statistics.median(f1):10.1f} {unit}  factor2 "
                  f"{statistics.median(f2):10.1f} {unit}  ratio {statistics.median(f2) / statistics.median(f1):.2f} "
                  f"[{each}]")
    with open(a.out, "w") as f:
        json.dump({"machine": machine, "cpus": os.cpu_count(), "commit": commit, "ps_threads": a.ps_threads,
                   "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()
