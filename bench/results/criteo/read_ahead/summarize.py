"""Recomputes the read-ahead figures of bench/results/HISTORY.md from runs.txt."""
import os
import statistics
rows = [l.split() for l in open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs.txt"))]
for t in ("old", "new"):
    ts = [float(r[2]) for r in rows if r[0] == t]
    eps = [float(r[3]) for r in rows if r[0] == t]
    rss = [int(r[5]) for r in rows if r[0] == t]
    auc = sorted({r[6] for r in rows if r[0] == t})
    print("%s: train_s median %.3f (%.3f-%.3f), examples/s median %.0f, peak RSS median %d KiB (%d-%d), AUC %s"
          % (t, statistics.median(ts), min(ts), max(ts), statistics.median(eps), statistics.median(rss), min(rss), max(rss), auc))
o = statistics.median(float(r[2]) for r in rows if r[0] == "old")
n = statistics.median(float(r[2]) for r in rows if r[0] == "new")
print("old/new train_s (medians): %.3f" % (o / n))
