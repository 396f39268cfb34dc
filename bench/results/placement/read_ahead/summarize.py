#!/usr/bin/env python3
"""Before and after the hand-over's read ahead (protocol 1.19), from this folder's runs of
../trainer_move/run.py --configs deltas,deltas-before (the same job, the two builds in turn, the
order alternating by round). Prints, per move, the pause in steps and the hand-over's seconds of
each build and their ratio by round (after / before); and what reading ahead costs the training
around it: worker 0's examples/s in the log windows holding the checkpoints read ahead (steps
140-159 and 240-259: both builds checkpoint there, only "after" reads ahead) and in the quiet
windows, after / before by round.

  summarize.py [DIR]   (DIR: this folder)"""
import glob
import importlib.util
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("run", os.path.join(HERE, "..", "trainer_move", "run.py"))
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)


def med(xs):
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def windows(out):
    return {int(s): float(e) for s, e in re.findall(r"^\[worker 0\] step (\d+)/\d+ .* (\d+) examples/s", out, re.M)}


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else HERE
    rounds = sorted(int(re.search(r"-(\d+)\.txt$", p).group(1)) for p in glob.glob(os.path.join(d, "run-deltas-[0-9]*.txt")))
    rows = {}  # (config, round) -> parsed rows
    outs = {}
    for k in rounds:
        for config in ("deltas", "deltas-before"):
            with open(os.path.join(d, f"run-{config}-{k}.txt")) as f:
                outs[config, k] = f.read()
            rows[config, k] = run.parse(outs[config, k], k, config, 512, 20)
    lines = [f"{len(rounds)} rounds; medians (min-max)"]
    for i, what in enumerate(("server 2 drained (step 200)", "the first map (step 300)")):
        pause = {c: [rows[c, k][i][7] for k in rounds] for c in ("deltas", "deltas-before")}
        hand = {c: [rows[c, k][i][5] for k in rounds] for c in ("deltas", "deltas-before")}
        ratio = [rows["deltas", k][i][7] / rows["deltas-before", k][i][7] for k in rounds]
        hratio = [rows["deltas", k][i][5] / rows["deltas-before", k][i][5] for k in rounds]
        lines.append(f"{what}: pause in steps before {med(pause['deltas-before'])}, after {med(pause['deltas'])}; "
                     f"after/before by round {med(ratio)}")
        lines.append(f"{what}: hand-over s before {med(hand['deltas-before'])}, after {med(hand['deltas'])}; "
                     f"after/before by round {med(hratio)}")
    for window in (160, 260):
        r = [windows(outs["deltas", k])[window] / windows(outs["deltas-before", k])[window] for k in rounds]
        lines.append(f"examples/s of the window of steps {window - 20}-{window - 1} (a checkpoint in both; the read "
                     f"ahead after): after/before by round {med(r)}")
    step = {c: [rows[c, k][0][6] for k in rounds] for c in ("deltas", "deltas-before")}
    sr = [rows["deltas", k][0][6] / rows["deltas-before", k][0][6] for k in rounds]
    lines.append(f"step ms (quiet windows) before {med(step['deltas-before'])}, after {med(step['deltas'])}; "
                 f"after/before by round {med(sr)}")
    # The servers' own split of each hand-over (the build after logs it): the check round's read
    # and check, the adopting round's work, in seconds, min-max over the rounds.
    split = {}
    for k in rounds:
        for rank, version, read, checked, applied in re.findall(
                r"^\[ps \d\] ferry-ps (\d): placement version (\d) from the checkpoint of step \d+: .*\(checking: "
                r"read ([\d.]+) s, checked ([\d.]+) s; adopting: read [\d.]+ s, applied ([\d.]+) s\)$",
                outs["deltas", k], re.M):
            split.setdefault((int(version), int(rank)), []).append((float(read), float(checked), float(applied)))
    for (version, rank), xs in sorted(split.items()):
        parts = [f"{name} {min(x[i] for x in xs):.3f}-{max(x[i] for x in xs):.3f}"
                 for i, name in enumerate(("read", "checked", "applied"))]
        lines.append(f"after, placement version {version}, server {rank} ({len(xs)} rounds), s: " + ", ".join(parts))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(d, "ab_summary.txt"), "w") as f:
        f.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
