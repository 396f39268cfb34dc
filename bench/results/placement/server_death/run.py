#!/usr/bin/env python3
"""What a server's death costs a sync training job today (issue 38's "the pause a worker sees
while a server ... dies", before replication): the ctr job of ../trainer_move (3 servers, 2
workers under ferry-launch, tcp loopback, Adam, batch 512, 400 steps, a checkpoint every 50
steps, --checkpoint-deltas 8), run whole and with ps 1 killed by SIGKILL once worker 0 has logged
step 240 (steps 220-239 done; the checkpoint of step 200 saved), in turn, the order alternating by
round. The launcher then restarts every process from the newest checkpoint. Reports, per round:
the launcher's recovery line (steps lost, recovery time: from noticing the death to the last
restarted worker's "resuming the job" line, also in steps), and the job's whole wall time against
the same job not killed, as seconds and as steps, and what is left of it past the steps redone
and the recovery (rest_s); a step is the unkilled job's median step (its
log windows holding no checkpoint), as ../trainer_move/run.py takes a hand-over's pause in steps.

  run.py --bin build/bin --out DIR [--rounds K] [--from-files]
Writes DIR/run-<killed|whole>-<k>.txt (the launcher's output, with the wall time as its last
line) and prints DIR/summary.txt."""
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
STEPS, BATCH, LOG_EVERY, KILL_AT = 400, 512, 20, 240


def one(args, k, config):
    with tempfile.TemporaryDirectory(prefix="ferry-death-bench-") as tmp:
        argv = [sys.executable, LAUNCHER, "--num-ps", "3", "--num-workers", "2", "--base-port", "0",
                "--gpus-per-host", "0", "--bin-dir", args.bin, "--log-dir", os.path.join(tmp, "logs"),
                "--checkpoint-dir", os.path.join(tmp, "ckpt"), "--checkpoint-every", "50",
                "--ps-arg", "--checkpoint-deltas 8", "--",
                "--model", "ctr", "--ctr-train", "400000", "--ctr-test", "2000", "--ctr-vocab", "1000000",
                "--steps", str(STEPS), "--batch", str(BATCH), "--consistency", "sync", "--log-every",
                str(LOG_EVERY), "--blas-threads", "1", "--optimizer", "adam", "--lr", "0.01",
                "--table", "ctr/*:chunk_elems=4096"]
        began = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        timer = threading.Timer(600, proc.kill)
        timer.start()
        lines, killed = [], False
        for line in proc.stdout:
            lines.append(line)
            if config == "killed" and not killed and re.match(rf"\[worker 0\] step {KILL_AT}/", line):
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


def step_s(out):
    """The median step of worker 0's log windows holding no checkpoint (a window "step S" follows
    the steps S - 20 to S - 1)."""
    saved = [int(s) for s in re.findall(r"^\[worker 0\] checkpoint of step (\d+) saved", out, re.M)]
    quiet = [float(e) for s, e in re.findall(r"^\[worker 0\] step (\d+)/\d+ .* (\d+) examples/s", out, re.M)
             if not any(int(s) - LOG_EVERY <= c < int(s) for c in saved)]
    return BATCH / statistics.median(quiet)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--from-files", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    lines = [f"{'round':5} {'lost':>5} {'recovery_s':>10} {'recovery_steps':>14} {'wall_killed_s':>13} "
             f"{'wall_whole_s':>12} {'step_ms':>8} {'extra_s':>8} {'extra_steps':>11} {'rest_s':>7}"]
    extra_steps, recovery, recovery_steps, lost = [], [], [], []
    for k in range(args.rounds):
        outs = {}
        for config in (("whole", "killed") if k % 2 == 0 else ("killed", "whole")):
            if args.from_files:
                with open(os.path.join(args.out, f"run-{config}-{k}.txt")) as f:
                    outs[config] = f.read()
            else:
                outs[config] = one(args, k, config)
        m = re.search(r"recovery 1 of at most \d+: ps 1 \(pid \d+\) died \(killed by SIGKILL\); .*steps lost: (\d+).*"
                      r"recovery time ([\d.]+) s", outs["killed"])
        if not m:
            sys.exit(f"run.py: round {k}: no complete recovery in run-killed-{k}.txt")
        step = step_s(outs["whole"])
        extra = wall(outs["killed"]) - wall(outs["whole"])
        lost.append(int(m.group(1)))
        recovery.append(float(m.group(2)))
        extra_steps.append(extra / step)
        recovery_steps.append(recovery[-1] / step)
        lines.append(f"{k:5} {lost[-1]:5} {recovery[-1]:10.2f} {recovery_steps[-1]:14.1f} "
                     f"{wall(outs['killed']):13.2f} {wall(outs['whole']):12.2f} {step * 1e3:8.2f} {extra:8.2f} "
                     f"{extra_steps[-1]:11.1f} {extra - lost[-1] * step - recovery[-1]:7.2f}")
    lines.append(f"# {args.rounds} rounds: steps lost median {statistics.median(lost)} ({min(lost)}-{max(lost)}); "
                 f"recovery time median {statistics.median(recovery):.2f} s ({min(recovery):.2f}-{max(recovery):.2f}), "
                 f"{statistics.median(recovery_steps):.1f} steps ({min(recovery_steps):.1f}-{max(recovery_steps):.1f}); "
                 f"the killed job took longer by a median {statistics.median(extra_steps):.1f} steps "
                 f"({min(extra_steps):.1f}-{max(extra_steps):.1f}) of the whole job's step")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
