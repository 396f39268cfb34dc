#!/usr/bin/env python3
"""The Python module's pull and push against the C++ client's, in one run, on the same ferry-ps.

Starts one ferry-ps on 127.0.0.1, then for each round runs bench/ferry-client-bench (the C++
client, Google Benchmark) and the same operations through the `ferry` module in this process,
alternating which goes first. Each operation is one call, submitted and waited for: dense pull
and push of 4 KiB, 1 MiB and 16 MiB, sparse pull and push of 100,000 distinct ids of dim 16
(the ids of client_bench.cc). Python times each operation as Google Benchmark does: calls in a
loop until at least --min-time seconds have passed, the mean per call. Prints, per operation,
the median of the rounds for each side, their ratio, and each round's ratio.

Run with Debian's interpreter (the module is built for it):
  /usr/bin/python3 bench/python_vs_cpp.py --build-dir build [--rounds 5] [--json out.json]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

OPS = [("pull_dense", 1024), ("pull_dense", 262144), ("pull_dense", 4194304),
       ("push_dense", 1024), ("push_dense", 262144), ("push_dense", 4194304),
       ("pull_sparse", 100000), ("push_sparse", 100000)]
DIM = 16


def label(op, n):
    if op.endswith("dense"):
        size = {1024: "4KiB", 262144: "1MiB", 4194304: "16MiB"}[n]
        return f"{op}/{size}"
    return f"{op}/100k_ids_dim16"


def cpp_name(op, n):
    base = {"pull_dense": "BM_PullDense", "push_dense": "BM_PushDense",
            "pull_sparse": "BM_PullSparse", "push_sparse": "BM_PushSparse"}[op]
    return f"{base}/{n}/real_time" if op.endswith("dense") else f"{base}/real_time"


def run_cpp(bench, endpoint, min_time):
    r = subprocess.run([bench, f"--servers={endpoint}", "--table-prefix=cpp_", "--benchmark_format=json",
                        f"--benchmark_min_time={min_time}"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"ferry-client-bench failed ({r.returncode}): {r.stderr}")
    out = {}
    for b in json.loads(r.stdout)["benchmarks"]:
        if "error_occurred" in b:
            sys.exit(f"{b['name']}: {b.get('error_message')}")
        out[b["name"]] = b["real_time"] * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[b["time_unit"]]
    return {(op, n): out[cpp_name(op, n)] for op, n in OPS}


def run_py(ferry, np, client, min_time):
    ids = np.arange(100000, dtype=np.int64) * 7919 + 13
    rows = np.empty((len(ids), DIM), np.float32)
    grads = np.zeros((len(ids), DIM), np.float32)
    dense = {n: np.empty(n, np.float32) for _, n in OPS}
    zeros = {n: np.zeros(n, np.float32) for _, n in OPS}
    calls = {
        "pull_dense": lambda n: client.pull_dense(f"py_dense_{n}", dense[n]).wait(),
        "push_dense": lambda n: client.push_dense(f"py_dense_{n}", zeros[n]).wait(),
        "pull_sparse": lambda n: client.pull_sparse("py_sparse", ids, out=rows).wait(),
        "push_sparse": lambda n: client.push_sparse("py_sparse", ids, grads).wait(),
    }
    out = {}
    for op, n in OPS:
        call = calls[op]
        call(n)  # warm-up, as Google Benchmark's first estimate
        iters, start = 0, time.perf_counter()
        while True:
            call(n)
            iters += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        out[(op, n)] = elapsed / iters * 1e6
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--json", help="also write every round's figures here")
    args = ap.parse_args()
    build = os.path.abspath(args.build_dir)
    sys.path.insert(0, os.path.join(build, "python"))
    import numpy as np
    import ferry

    ps = subprocess.Popen([os.path.join(build, "bin", "ferry-ps"), "--bind", "tcp://127.0.0.1:0",
                           "--compute-threads", "1"], stdout=subprocess.PIPE, text=True)
    try:
        endpoint = re.search(r"(tcp://\S+)", ps.stdout.readline()).group(1)
        client = ferry.Client([endpoint])
        for _, n in OPS[:3]:
            client.declare_dense(f"py_dense_{n}", (n,))
        client.declare_sparse("py_sparse", DIM)
        rounds = []
        for r in range(args.rounds):
            order = ["cpp", "py"] if r % 2 == 0 else ["py", "cpp"]
            got = {}
            for side in order:
                got[side] = (run_cpp(os.path.join(build, "bench", "ferry-client-bench"), endpoint, args.min_time)
                             if side == "cpp" else run_py(ferry, np, client, args.min_time))
            rounds.append(got)
        client.close()
    finally:
        ps.terminate()
        ps.wait(timeout=10)

    print(f"{'operation':28s} {'C++ us':>10s} {'Python us':>10s} {'Py/C++':>7s}  per round")
    table = []
    for op, n in OPS:
        c = [g["cpp"][(op, n)] for g in rounds]
        p = [g["py"][(op, n)] for g in rounds]
        mc, mp = statistics.median(c), statistics.median(p)
        per = [pi / ci for pi, ci in zip(p, c)]
        table.append({"op": label(op, n), "cpp_us": c, "py_us": p})
        print(f"{label(op, n):28s} {mc:10.1f} {mp:10.1f} {mp / mc:7.3f}  " + " ".join(f"{x:.2f}" for x in per))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"endpoint": endpoint, "rounds": args.rounds, "min_time_s": args.min_time, "ops": table}, f,
                      indent=1)


if __name__ == "__main__":
    main()
