"""ferry-matrix: runs a matrix of Ferry training jobs on real local clusters and reports them.

Modules, in the order a run goes through them:
  presets  what to run: modes, worker counts, models, budgets, targets (configuration as data)
  runner   one run: launch/ferry-launch with a deadline, its logs and the workers' metrics files
  metrics  the trainer's JSON lines -> one record per run (time to target, throughput, ...)
  report   runs.json, runs.csv and summary.md
  plots    gnuplot scripts -> PNG
  machine  what the runs ran on
  cli      the command line, which ties them together

Python 3 standard library only; gnuplot (Debian: gnuplot-nox) for the plots.
"""
