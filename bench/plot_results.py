#!/usr/bin/env python3
"""Draws the plots of bench/RESULTS.md from recorded data, with gnuplot (SVG), and prints the
numbers each plot shows so that the page's figures can be checked against them.

  /usr/bin/python3 bench/plot_results.py [--out bench/results/plots]

Inputs (all tracked):
- ferry_vs_raw.svg: bench/results/client_drive/after-*.json and run2/after-*.json (the ferry-bench
  of 74f2730, 9 rounds each): Ferry's payload rate over the raw ZeroMQ round trip's of the same
  binary run, per round, as bench/results/client_drive/summarize.py computes it; the bars are the
  medians over the rounds of each run.
- compression_model.svg: bench/results/compression/run.json through
  bench/results/compression/summarize.py (its 16M codec rates): the time of a 16 MiB push+pull at
  a given network rate, transfer + codec time only, as that script's last table.
- pipeline_step.svg: bench/results/pipeline3/summary.txt (ctr, 554583b) and
  bench/results/pipeline2/summary.txt (MLP, da0b963): one worker, async, the step time beside
  its compute and its communication, per pipeline.
Needs gnuplot (Debian: gnuplot-nox); no Python package beyond the standard library.
"""
import argparse
import glob
import os
import re
import statistics
import subprocess
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, os.path.join(RESULTS, "before_after"))
from summarize import read_times  # noqa: E402  (one ferry-bench JSON file: name -> seconds a call)


FORMAT = "svg"  # --png: PNG images instead (pngcairo), e.g. to look at them where no SVG viewer is


def gnuplot(script):
    if FORMAT == "png":
        script = re.sub(r'set terminal svg size (\d+),(\d+) dynamic font "sans,12"',
                        r'set terminal pngcairo size \1,\2 font "sans,10"', script)
        script = script.replace('.svg"', '.png"')
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def ferry_vs_raw(out):
    """Ferry / raw per op, size and placement, the median over the rounds of each client_drive run."""
    rows = []
    for run, folder in (("run 1", "client_drive"), ("run 2", "client_drive/run2")):
        rounds = [read_times(p) for p in sorted(glob.glob(os.path.join(RESULTS, folder, "after-*.json")))]
        for size in ("4KiB", "16MiB"):
            for placement, raw, ps in (("processes", f"raw_proc/tcp/{size}", "ps_proc/{op}/tcp/" + size + "/1s1w"),
                                       ("one process", f"raw/tcp/{size}", "ps/{op}/tcp/" + size + "/1s1w")):
                for op in ("push", "pull", "pushpull"):
                    name = ps.format(op=op)
                    # a push or a pull moves the tensor once, a push+pull and a raw round trip twice
                    ratios = [r[raw] / (r[name] * (1 if op == "pushpull" else 2)) for r in rounds if name in r and raw in r]
                    times = [r[name] * 1e3 for r in rounds if name in r]
                    if ratios:
                        rows.append((run, size, placement, op, statistics.median(ratios), statistics.median(times),
                                     len(ratios)))
    print("## Ferry / raw ZeroMQ (74f2730, client_drive after-*.json): median over rounds")
    print("| run | size | placement | op | Ferry / raw | ms a call | rounds |")
    print("|---|---|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]:.3f} | {r[5]:.3f} | {r[6]} |")
    labels = []
    for size in ("4KiB", "16MiB"):
        for placement in ("processes", "one process"):
            for op in ("push", "pull", "pushpull"):
                if any(r[1] == size and r[2] == placement and r[3] == op for r in rows):
                    labels.append((size, placement, op))
    dat = os.path.join(out, "ferry_vs_raw.dat")
    with open(dat, "w") as f:
        f.write("# label run1 run2  (Ferry payload rate / raw ZeroMQ round trip rate, medians)\n")
        for size, placement, op in labels:
            vals = [next(r[4] for r in rows if r[:4] == (run, size, placement, op)) for run in ("run 1", "run 2")]
            name = op.replace("pushpull", "push+pull")
            f.write(f'"{size}\\n{name}\\n{placement}" {vals[0]:.4f} {vals[1]:.4f}\n')
    gnuplot(f"""
set terminal svg size 900,460 dynamic font "sans,12"
set output "{os.path.join(out, 'ferry_vs_raw.svg')}"
set title "Ferry's payload rate over raw ZeroMQ's (1 server, 1 worker, tcp loopback; ferry-bench of 74f2730)\\na push or a pull alone moves half a round trip's bytes: for them 0.5 is raw's pace" noenhanced
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set yrange [0:1.05]
set ytics 0.1
set grid ytics
set ylabel "Ferry / raw (1.0 = as fast as raw ZeroMQ)"
set key top left
set xtics font ",10"
set bmargin 5
plot "{dat}" using 2:xtic(1) title "run 1 (9 rounds)" lc rgb "#3b6ea8", "" using 3 title "run 2 (9 rounds)" lc rgb "#e08a2c"
""")


def compression_model(out):
    text = subprocess.run([sys.executable, os.path.join(RESULTS, "compression", "summarize.py")],
                          capture_output=True, text=True, check=True).stdout
    codec = {}
    for m in re.finditer(r"^\| ([\w.]+) \| 16M \| ([\d.]+) \| ([\d.]+) \|", text, re.M):
        codec[m.group(1)] = (float(m.group(2)), float(m.group(3)))  # s per GB of S, bytes saved / S
    s_gb = 16 * 2**20 / 1e9
    cases = ["f32", "fp16", "bf16", "topk0.01", "topk0.01_fp16"]
    rates = [0.5 * 1.1**i for i in range(0, 60)]
    rates = [r for r in rates if r <= 120]
    dat = os.path.join(out, "compression_model.dat")
    with open(dat, "w") as f:
        f.write("# Gbit/s " + " ".join(cases) + "  (ms for a 16 MiB push+pull: transfer + codec)\n")
        for g in rates:
            gbps = g / 8
            vals = []
            for c in cases:
                cs, saved = codec.get(c, (0.0, 0.0))
                vals.append(1e3 * (s_gb * (2 - saved) / gbps + cs * s_gb))
            f.write(f"{g:.4f} " + " ".join(f"{v:.3f}" for v in vals) + "\n")
    print("\n## A 16 MiB push+pull by the model (compression/run.json, 1abb86e), ms")
    print("| Gbit/s | " + " | ".join(cases) + " |")
    for g in (1, 10, 25, 100):
        vals = [1e3 * (s_gb * (2 - codec.get(c, (0, 0))[1]) / (g / 8) + codec.get(c, (0, 0))[0] * s_gb) for c in cases]
        print(f"| {g} | " + " | ".join(f"{v:.1f}" for v in vals) + " |")
    plots = ", ".join(f'"{dat}" using 1:{i + 2} with lines lw 2 title "{c}"' for i, c in enumerate(cases))
    gnuplot(f"""
set terminal svg size 760,420 dynamic font "sans,12"
set output "{os.path.join(out, 'compression_model.svg')}"
set title "16 MiB push+pull: transfer + codec time by network rate (codecs of 1abb86e, one core a side)"
set logscale xy
set xrange [0.5:100]
set xlabel "network rate, Gbit/s"
set ylabel "ms a push+pull (model)"
set grid
set key top right noenhanced
{"plot " + plots}
""")


def pipeline_step(out):
    """One worker, async: step, compute and comm medians per pipeline, from the summary files."""
    rows = []
    for model, folder in (("mlp", "pipeline2"), ("ctr", "pipeline3")):
        for line in open(os.path.join(RESULTS, folder, "summary.txt")):
            parts = [p.strip() for p in line.split("|")]
            head = parts[0].split()
            if (len(head) == 4 and head[0] == model and head[3] == "1" and len(parts) > 4
                    and (head[1] == "async" or head[2] == "local")):
                step, compute, comm = (float(parts[i].split()[0]) for i in (2, 3, 4))
                rows.append((model, head[2], step, compute, comm))
    print("\n## One worker, async: ms a step (pipeline2 for the MLP at da0b963, pipeline3 for ctr at 554583b)")
    print("| model | pipeline | step | compute | comm |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.3f} | {r[4]:.3f} |")
    dat = os.path.join(out, "pipeline_step.dat")
    with open(dat, "w") as f:
        f.write("# label step compute comm (ms, medians over rounds)\n")
        for model, pipe, step, compute, comm in rows:
            f.write(f'"{model}\\n{pipe}" {step:.3f} {compute:.3f} {comm:.3f}\n')
    gnuplot(f"""
set terminal svg size 760,400 dynamic font "sans,12"
set output "{os.path.join(out, 'pipeline_step.svg')}"
set title "A training step against its parts (1 worker, 1 ferry-ps, async, --blas-threads 1; local: one process)"
set bmargin 4
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set yrange [0:*]
set grid ytics
set ylabel "ms a step (median of the rounds)"
set key top right
plot "{dat}" using 2:xtic(1) title "step" lc rgb "#333333", "" using 3 title "compute" lc rgb "#3b6ea8", "" using 4 title "communication" lc rgb "#e08a2c"
""")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(RESULTS, "plots"))
    ap.add_argument("--png", action="store_true", help="PNG images instead of SVG")
    args = ap.parse_args()
    global FORMAT
    FORMAT = "png" if args.png else "svg"
    os.makedirs(args.out, exist_ok=True)
    ferry_vs_raw(args.out)
    compression_model(args.out)
    pipeline_step(args.out)


if __name__ == "__main__":
    main()
