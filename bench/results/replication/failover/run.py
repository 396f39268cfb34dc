#!/usr/bin/env python3
"""The pause a worker sees when a server dies (issue 38), with failover against without: an async ctr
job of 3 servers and 2 workers under ferry-launch (tcp loopback, Adam, batch 512, 400 steps, every
step logged), run whole and with ps 1 killed by SIGKILL once worker 0 has logged step 240, in two
set-ups:
  r2: --replication 2, no checkpoint folder: the launcher restarts ps 1 alone with --recover; the
      workers wait for it and go on (protocol 1.22);
  r1: replication 1, a checkpoint every 50 steps (--checkpoint-deltas 8): the launcher restarts
      every process from the newest checkpoint (the checkpoint of step 200), as before 1.22.
Each round runs the four jobs (r2 whole, r2 killed, r1 whole, r1 killed) in turn, the order
reversed every other round. Per killed job: the steps lost (redone) and the recovery time the
launcher reports, and how much longer it took than the whole job of its set-up, in seconds and in
steps of that whole job (its median step, from worker 0's per-step lines, leaving out the steps
that saved a checkpoint). With failover also the pause itself: each worker's longest step in the
killed job, less the whole job's median step (a worker whose step waits for the replacement).

With --consistency sync (protocol 1.23: sync tables replicated) the same jobs train sync steps,
and each killed job's final test metrics are compared with its whole job's (sync is exact: equal
with failover, and with a restart from the checkpoint).

  run.py --bin build/bin --out DIR [--rounds K] [--consistency async|sync] [--from-files]
Writes DIR/run-<config>-<k>.txt (the launcher's output, with the kill time and the wall time as
run.py lines) and prints DIR/summary.txt."""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(HERE, "..", "..", "..", "..", "launch", "ferry-launch")
STEPS, BATCH, KILL_AT = 400, 512, 240
CONFIGS = ("r2-whole", "r2-killed", "r1-whole", "r1-killed")


def one(args, k, config):
    with tempfile.TemporaryDirectory(prefix="ferry-failover-bench-") as tmp:
        setup = (["--replication", "2"] if config.startswith("r2") else
                 ["--checkpoint-dir", os.path.join(tmp, "ckpt"), "--checkpoint-every", "50",
                  "--ps-arg", "--checkpoint-deltas 8"])
        argv = [sys.executable, LAUNCHER, "--num-ps", "3", "--num-workers", "2", "--base-port", "0",
                "--gpus-per-host", "0", "--bin-dir", args.bin, "--log-dir", os.path.join(tmp, "logs")] + setup + [
                "--", "--model", "ctr", "--ctr-train", "400000", "--ctr-test", "2000", "--ctr-vocab", "1000000",
                "--steps", str(STEPS), "--batch", str(BATCH), "--consistency", args.consistency, "--log-every", "1",
                "--blas-threads", "1", "--optimizer", "adam", "--lr", "0.01", "--table", "ctr/*:chunk_elems=4096"]
        began = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        timer = threading.Timer(600, proc.kill)
        timer.start()
        lines, killed = [], False
        for line in proc.stdout:
            lines.append(line)
            if config.endswith("killed") and not killed and re.match(rf"\[worker 0\] step {KILL_AT}/", line):
                pid = int(re.search(r"started ps 1 pid (\d+)", "".join(lines)).group(1))
                os.kill(pid, signal.SIGKILL)
                killed = True
                lines.append(f"run.py: killed ps 1 (pid {pid}) with SIGKILL at {time.monotonic() - began:.3f} s\n")
        rc = proc.wait()
        timer.cancel()
        wall = time.monotonic() - began
    out = "".join(lines) + f"run.py: wall {wall:.3f} s, exit {rc}\n"
    with open(os.path.join(args.out, f"run-{config}-{k}.txt"), "w") as f:
        f.write(out)
    if rc != 0:
        sys.exit(f"run.py: the {config} job of round {k} exited {rc}: see run-{config}-{k}.txt")
    return out


def wall(out):
    return float(re.search(r"^run\.py: wall ([\d.]+) s", out, re.M).group(1))


def steps_s(out, worker):
    """Each step's seconds of `worker`, by step (its line "step S" follows step S - 1 alone), the
    last run of each step where a restart ran it again; without the steps that saved a checkpoint."""
    saved = {int(s) for s in re.findall(rf"^\[worker {worker}\] checkpoint of step (\d+) saved", out, re.M)}
    steps = {}
    for s, eps in re.findall(rf"^\[worker {worker}\] step (\d+)/\d+ .* (\d+) examples/s", out, re.M):
        if int(s) - 1 not in saved and int(s) not in saved and float(eps) > 0:
            steps[int(s)] = BATCH / float(eps)
    return steps


def final(out):
    """Worker 0's final test metrics, as printed on its "done:" line, or None."""
    found = re.findall(r"^\[worker 0\] done: .*; (test .*)$", out, re.M)
    return found[-1] if found else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--consistency", choices=("async", "sync"), default="async")
    ap.add_argument("--from-files", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lines = [f"{'round':5} {'setup':5} {'lost':>5} {'recovery_s':>10} {'step_ms':>8} {'wall_killed_s':>13} "
             f"{'wall_whole_s':>12} {'extra_s':>8} {'extra_steps':>11} {'pause_s':>8} {'pause_steps':>11} "
             f"{'same_metrics':>13}"]
    table = {"r1": [], "r2": []}
    for k in range(args.rounds):
        outs = {}
        for config in (CONFIGS if k % 2 == 0 else tuple(reversed(CONFIGS))):
            if args.from_files:
                with open(os.path.join(args.out, f"run-{config}-{k}.txt")) as f:
                    outs[config] = f.read()
            else:
                outs[config] = one(args, k, config)
        for setup in ("r2", "r1"):
            killed, whole = outs[f"{setup}-killed"], outs[f"{setup}-whole"]
            m = re.search(r"recovery 1 of at most \d+: ps 1 \(pid \d+\) died \(killed by SIGKILL\); .*steps lost: "
                          r"(\d+).*recovery time ([\d.]+) s", killed)
            if not m:
                sys.exit(f"run.py: round {k}: no complete recovery in run-{setup}-killed-{k}.txt")
            step = statistics.median(steps_s(whole, 0).values())
            extra = wall(killed) - wall(whole)
            pause = float("nan")
            if setup == "r2":  # the workers went on: each one's longest step holds its wait
                pause = max(max(steps_s(killed, w).values()) for w in (0, 1)) - step
            row = dict(lost=int(m.group(1)), recovery=float(m.group(2)), step=step, extra=extra,
                       extra_steps=extra / step, pause=pause, pause_steps=pause / step,
                       same=final(killed) == final(whole) and final(whole) is not None)
            table[setup].append(row)
            lines.append(f"{k:5} {setup:5} {row['lost']:5} {row['recovery']:10.2f} {step * 1e3:8.2f} "
                         f"{wall(killed):13.2f} {wall(whole):12.2f} {extra:8.2f} {row['extra_steps']:11.1f} "
                         f"{pause:8.3f} {row['pause_steps']:11.1f} {'yes' if row['same'] else 'no':>13}")

    def med(setup, key, fmt):
        v = [r[key] for r in table[setup]]
        return f"{statistics.median(v):{fmt}} ({min(v):{fmt}}-{max(v):{fmt}})"

    for setup, what in (("r2", "failover (--replication 2)"), ("r1", "restart from the checkpoint (replication 1)")):
        lines.append(f"# {setup}, {what}, {args.rounds} rounds, median (range): steps lost {med(setup, 'lost', '.0f')}; "
                     f"recovery {med(setup, 'recovery', '.2f')} s; the killed job longer by "
                     f"{med(setup, 'extra', '.2f')} s, {med(setup, 'extra_steps', '.1f')} steps"
                     + (f"; the longest step less the median {med(setup, 'pause', '.3f')} s, "
                        f"{med(setup, 'pause_steps', '.1f')} steps" if setup == "r2" else "")
                     + f"; final test metrics equal to the whole job's in {sum(r['same'] for r in table[setup])} of "
                       f"{len(table[setup])} rounds")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
