#!/usr/bin/env python3
"""The CPU a training cluster spends per example, against one process's (issue 34).

For each size S (S servers and S workers, all ferry-ps and ferry-trainer processes on this
machine, tcp loopback) and for one process (`ferry-trainer --local`), the MLP is trained sync
for STEPS_SHORT and STEPS_LONG steps. Each process's user and system time comes from wait4(2)
on it; start-up and the final evaluation cost the same in both runs of a size, so the CPU of
the extra steps (long minus short) over the extra examples (steps x batch x workers) is the CPU
per example with both taken out. Rounds alternate the configurations in a random order. One JSON
line per run goes to OUT/runs.jsonl; summarize.py reads it.

  python3 bench/results/cpu_per_example/run.py --bin build/bin --out bench/results/cpu_per_example \\
      --rounds 3 --sizes 1,2,4
"""
import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_all(procs):
    """Waits for every (role, Popen); returns [(role, user_s, sys_s, exit status)]."""
    out = []
    for role, p in procs:
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.append((role, ru.ru_utime, ru.ru_stime, p.returncode))
    return out


def run(binary, size, steps, common, log):
    """One job; size 0 is one process (--local). Returns the run's record."""
    started = time.monotonic()
    procs = []
    if size == 0:
        args = [f"{binary}/ferry-trainer", "--local", *common, "--steps", str(steps)]
        procs.append(("worker", subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)))
    else:
        ports = [free_port() for _ in range(size)]
        servers = ",".join(f"tcp://127.0.0.1:{p}" for p in ports)
        for rank, port in enumerate(ports):
            args = [f"{binary}/ferry-ps", "--bind", f"tcp://127.0.0.1:{port}", "--rank", str(rank),
                    "--num-servers", str(size), "--num-workers", str(size)]
            procs.append(("server", subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)))
        workers = []
        for rank in range(size):
            args = [f"{binary}/ferry-trainer", "--servers", servers, "--rank", str(rank), "--num-workers",
                    str(size), *common, "--steps", str(steps)]
            workers.append(("worker", subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)))
        done = wait_all(workers)
        for _, p in procs:
            p.terminate()  # the servers stop on SIGTERM once the workers are done
        done += wait_all(procs)
        procs = []
        return record(size, steps, done, time.monotonic() - started)
    return record(size, steps, wait_all(procs), time.monotonic() - started)


def record(size, steps, done, wall):
    failed = [d for d in done if d[0] == "worker" and d[3] != 0]
    if failed:
        sys.exit(f"a worker of size {size}, {steps} steps exited with {failed[0][3]} (see the log)")
    cpu = {"server": 0.0, "worker": 0.0}
    for role, user, system, _ in done:
        cpu[role] += user + system
    return {"size": size, "steps": steps, "server_cpu_s": cpu["server"], "worker_cpu_s": cpu["worker"],
            "wall_s": wall}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--out", default="bench/results/cpu_per_example")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--first-round", type=int, default=1, help="the first round's number (more rounds, same folder)")
    ap.add_argument("--sizes", default="1,2,4")
    ap.add_argument("--steps-short", type=int, default=100)
    ap.add_argument("--steps-long", type=int, default=400)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    # The MLP on Fashion-MNIST, sync; one BLAS thread a process, so that compute is the same work
    # in every configuration; no evaluation but the final one.
    common = ["--model", "mlp", "--batch", str(args.batch), "--device", "cpu", "--blas-threads", "1",
              "--consistency", "sync", "--quiet", "--log-every", "0"]
    configs = [(0, s) for s in (args.steps_short, args.steps_long)]
    for size in (int(x) for x in args.sizes.split(",")):
        configs += [(size, s) for s in (args.steps_short, args.steps_long)]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "runs.jsonl"), "a") as out, open(os.path.join(args.out, "run.log"), "a") as log:
        for r in range(args.rounds):
            order = configs[:]
            random.shuffle(order)
            for size, steps in order:
                rec = run(args.bin, size, steps, common, log)
                rec.update({"round": args.first_round + r, "batch": args.batch, "load1": os.getloadavg()[0]})
                out.write(json.dumps(rec) + "\n")
                out.flush()
                print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
