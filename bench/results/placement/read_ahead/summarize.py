#!/usr/bin/env python3
"""Before and after the hand-over's read ahead (protocol 1.19), from this folder's runs of
../trainer_move/run.py --configs deltas,deltas-before (the same job, the two builds in turn, the
order alternating by round). Prints, per move, the pause in steps and the hand-over's seconds of
each build and their ratio by round (after / before); what reading ahead costs the training
around it: worker 0's examples/s from the checkpoint read ahead to the move (steps 140-199 and
240-299: both builds checkpoint there, only "after" reads ahead) and in run.py's quiet windows,
after / before by round; and the servers' own split of each hand-over after.

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
    # From the checkpoint read ahead to the step before the move: steps 140-199 and 240-299 (the
    # windows ending at 160, 180, 200 and 260, 280, 300), a checkpoint in both builds, the read
    # ahead after: worker 0's examples/s over the stretch (its time, summed over the windows).
    def rate(out, ends):
        w = windows(out)
        return len(ends) * 20 * 512 / sum(20 * 512 / w[e] for e in ends)
    for ends in ((160, 180, 200), (260, 280, 300)):
        r = [rate(outs["deltas", k], ends) / rate(outs["deltas-before", k], ends) for k in rounds]
        lines.append(f"examples/s over steps {ends[0] - 20}-{ends[-1] - 1} (a checkpoint in both; the read ahead "
                     f"after): after/before by round {med(r)}")
    def total(out):  # worker 0's seconds at its last log line: the whole training, moves included
        return float(re.findall(r"^\[worker 0\] step \d+/\d+ .* ([\d.]+) s  ETA", out, re.M)[-1])
    tr = [total(outs["deltas", k]) / total(outs["deltas-before", k]) for k in rounds]
    lines.append(f"worker 0's training seconds (400 steps, 0.1 s resolution) after/before by round {med(tr)}")
    step = {c: [rows[c, k][0][6] for k in rounds] for c in ("deltas", "deltas-before")}
    sr = [rows["deltas-before", k][0][6] / rows["deltas", k][0][6] for k in rounds]
    lines.append(f"step ms (run.py's quiet windows, which may hold the end of a read ahead) before "
                 f"{med(step['deltas-before'])}, after {med(step['deltas'])}; examples/s after/before by round "
                 f"{med(sr)}")
    # The servers' own split of each hand-over (the build after logs it): the check round's read
    # and check, the adopting round's work, in seconds, min-max over the rounds.
    split = {}
    for k in rounds:
        for rank, version, read, checked, applied in re.findall(
                r"^\[ps \d\] ferry-ps (\d): placement version (\d) from the checkpoint of step \d+: .*\(checking: "
                r"read ([\d.]+) s, checked ([\d.]+) s; adopting: read [\d.]+ s, applied ([\d.]+) s\)"
                r"(?:; \d+ shard chain\(s\) started from the read ahead)?$",
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
