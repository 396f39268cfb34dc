#!/usr/bin/env python3
"""The pause a training job sees when its servers' slots move (issue 38; ferry-trainer
--move-slots), as a ratio to its step time: a sync ctr job of 3 servers and 2 workers under
ferry-launch (tcp loopback) empties server 2 into the others at one step and fills it again by the
first map at a later one. Worker 0 prints each move's checkpoint and hand-over seconds; the step
time is the median of the log windows holding no move and no checkpoint (a window's examples/s
on worker 0, whose every step is --batch examples). Every worker waits at the move's barrier for all of it, so the
pause is the same for each.

  run.py --bin build/bin --out DIR [--rounds K] [--vocab V] [--steps N] [--configs full,deltas]
         [--before-bin DIR] [--from-files]
Configurations, in turn (the order alternating by round): "full" (no other checkpoint: the move's own is full);
"deltas" (servers with --checkpoint-deltas 8, a checkpoint every 50 steps: the move's checkpoint
is a delta of the one before, and the hand-over reads the chain); "join" (protocol 1.20: the
servers' first map gives slots to servers 0 and 1 alone, --active-servers 2; server 2 joins at
the first move (a quarter of the steps), taking a fair share, and is drained at the second (half
of them), after which it leaves the job,
--exit-when-drained: the summary adds how long after its drain it left, and the rows and chunks
it took against those servers 0 and 1 gave up). A configuration named
"<config>-before" runs the binaries of --before-bin (another build) the same way, for a before and
after in one run. Writes DIR/run-<config>-<k>.txt (the launcher's output) and prints the summary
(DIR/summary.txt)."""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(HERE, "..", "..", "..", "..", "launch", "ferry-launch")


def one(args, k, config):
    """Runs one job; returns the launcher's output (also written to DIR/run-<config>-<k>.txt)."""
    with tempfile.TemporaryDirectory(prefix="ferry-move-bench-") as tmp:
        before = config.endswith("-before")
        deltas = config.removesuffix("-before") == "deltas"
        join = config.removesuffix("-before") == "join"
        # (A server leaves 2 s after every worker holds the map that drained it: the join job
        # trains on for half its steps after the drain, so that it leaves before the job ends.)
        first, back = (args.steps // 4, args.steps // 2) if join else (args.steps // 2, args.steps * 3 // 4)
        argv = [sys.executable, LAUNCHER, "--num-ps", "3", "--num-workers", "2", "--base-port", "0",
                "--gpus-per-host", "0", "--bin-dir", args.before_bin if before else args.bin,
                "--log-dir", os.path.join(tmp, "logs"),
                "--checkpoint-dir", os.path.join(tmp, "ckpt")]
        if deltas:
            argv += ["--checkpoint-every", "50", "--ps-arg", "--checkpoint-deltas 8"]
        if join:
            argv += ["--ps-arg", "--active-servers 2 --exit-when-drained"]
        argv += ["--",
                 "--model", "ctr", "--ctr-train", str(args.train), "--ctr-test", "2000", "--ctr-vocab",
                 str(args.vocab), "--steps", str(args.steps), "--batch", str(args.batch), "--consistency", "sync",
                 "--log-every", str(args.log_every), "--blas-threads", "1", "--optimizer", "adam", "--lr", "0.01",
                 "--table", "ctr/*:chunk_elems=4096", "--move-slots",
                 f"{first}:join=2,{back}:drain=2" if join else f"{first}:drain=2,{back}:first"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    with open(os.path.join(args.out, f"run-{config}-{k}.txt"), "w") as f:
        f.write(done.stdout)
    if done.returncode != 0:
        sys.exit(f"run.py: the {config} job of round {k} exited {done.returncode}: see run-{config}-{k}.txt")
    return done.stdout


def parse(out, k, config, batch, log_every):
    """The rows of one job's moves. A window's line "step S" follows the steps S - log_every to
    S - 1 (0-based); the step time is the median of the windows holding no move and no checkpoint."""
    moves = re.findall(r"^\[worker 0\] moved \d+ slots at step (\d+) \(([^)]*)\): placement version \d+; "
                       r"checkpoint ([\d.]+) s, hand-over ([\d.]+) s(?: \(read ahead from the checkpoint of step "
                       r"\d+\)| \(the servers had read the checkpoint of step \d+ ahead\))?$", out, re.M)
    sizes = dict(re.findall(r"^\[worker 0\] checkpoint of step (\d+) saved: ([\d.]+) MB", out, re.M))
    windows = [(int(s), float(e)) for s, e in
               re.findall(r"^\[worker 0\] step (\d+)/\d+ .* (\d+) examples/s", out, re.M)]
    busy = [int(m[0]) for m in moves] + [int(c) for c in sizes]
    quiet = [e for s, e in windows if not any(s - log_every <= b < s for b in busy)]
    if len(moves) != 2 or not quiet:
        sys.exit(f"run.py: round {k} ({config}): {len(moves)} moves and {len(quiet)} quiet windows in its output")
    step_s = batch / statistics.median(quiet)
    rows = []
    for step, what, ckpt, hand in moves:
        pause = float(ckpt) + float(hand)
        rows.append((k, int(step), f"{config}: {what}", float(sizes[step]), float(ckpt), float(hand), step_s * 1e3,
                     pause / step_s))
    return rows


def leaving(out):
    """A join run's server 2: (seconds from its drain to leaving the job, rows and chunks it took
    when it joined, rows and chunks servers 0 and 1 gave up then), or None."""
    left = re.search(r"^\[ps 2\] ferry-ps 2: owns no slot of placement version \d+ and no worker will send here "
                     r"again: left the job after ([\d.]+) s \(every worker held the map after ([\d.]+) s\)$", out, re.M)
    took = re.search(r"^\[ps 2\] ferry-ps 2: placement version 2 from the checkpoint of step \d+: took (\d+) chunks "
                     r"and (\d+) rows", out, re.M)
    held = re.findall(r"^\[ps [01]\] ferry-ps [01]: placement version 2 from the checkpoint of step \d+: took 0 "
                      r"chunks and 0 rows, gave up (\d+) chunks and (\d+) rows", out, re.M)
    if not (left and took and len(held) == 2):
        return None
    return float(left.group(1)), float(left.group(2)), int(took.group(2)), int(took.group(1)), \
        sum(int(h[1]) for h in held), sum(int(h[0]) for h in held)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=1000000)
    ap.add_argument("--train", type=int, default=400000)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--configs", default="full,deltas")
    ap.add_argument("--before-bin", help="the binaries of the <config>-before configurations")
    ap.add_argument("--from-files", action="store_true", help="parse DIR's run files again, run nothing")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows, joins = [], []
    configs = args.configs.split(",")
    for k in range(args.rounds):
        for config in (configs if k % 2 == 0 else configs[::-1]):  # the order alternates by round
            if args.from_files:
                with open(os.path.join(args.out, f"run-{config}-{k}.txt")) as f:
                    out = f.read()
            else:
                out = one(args, k, config)
            rows += parse(out, k, config, args.batch, args.log_every)
            if config.removesuffix("-before") == "join":
                joins.append(leaving(out))
    lines = [f"{'round':5} {'step':>5} {'move':26} {'ckpt_MB':>8} {'ckpt_s':>7} {'handover_s':>10} "
             f"{'step_ms':>8} {'pause/step':>10}"]
    for r in rows:
        lines.append(f"{r[0]:5} {r[1]:5} {r[2]:26} {r[3]:8.1f} {r[4]:7.2f} {r[5]:10.2f} {r[6]:8.2f} {r[7]:10.1f}")
    for what in sorted({r[2] for r in rows}):
        ratios = [r[7] for r in rows if r[2] == what]
        hands = [r[5] for r in rows if r[2] == what]
        ckpts = [r[4] for r in rows if r[2] == what]
        lines.append(f"# {what}: pause/step median {statistics.median(ratios):.1f} ({min(ratios):.1f}-"
                     f"{max(ratios):.1f}); checkpoint s median {statistics.median(ckpts):.2f}, hand-over s median "
                     f"{statistics.median(hands):.2f}, {len(ratios)} rounds")
    if joins:
        if None in joins:
            sys.exit("run.py: a join run's server 2 lines are missing")
        # The rows and chunks server 2 took are the ones servers 0 and 1 gave up (a check).
        for k, (left_s, held_s, rows_took, chunks_took, rows_gave, chunks_gave) in enumerate(joins):
            lines.append(f"# join round {k}: server 2 left {left_s:.3f} s after its drain (every worker held the map "
                         f"after {held_s:.3f} s); it took {rows_took} rows and {chunks_took} chunks (servers 0 and 1 "
                         f"gave up {rows_gave} and {chunks_gave})")
        for i, what in ((0, "left"), (1, "every worker held the map")):
            v = [j[i] for j in joins]
            lines.append(f"# join: {what} after its drain, median {statistics.median(v):.3f} s ({min(v):.3f}-"
                         f"{max(v):.3f}), {len(joins)} rounds")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
