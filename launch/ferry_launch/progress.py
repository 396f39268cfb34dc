"""--progress job: one progress line for the job instead of one per worker.

Workers print "[worker R] step T/TOTAL ... [N examples/s] ... [loss L]" (ferry-trainer, and
ferry.torch's Session.log_step). JobProgress takes those lines off the console (the workers' logs
keep them) and, each time the slowest worker reports a later step, prints

    [job] step 300/1000 (workers at 300-320): 51234 examples/s in all, mean loss 0.4512, ETA 2m10s

Every other line passes through unchanged."""

import re
import threading
import time

PROGRESS_LINE = re.compile(r"^\[worker (\d+)\] step (\d+)/(\d+)\b(.*)$")
EXAMPLES_PER_S = re.compile(r"([\d.]+) examples/s")
LOSS = re.compile(r"\bloss:? (-?[\d.]+(?:[eE][-+]?\d+)?)")


def duration(seconds):
    """45s, 3m05s, 2h03m."""
    s = int(seconds + 0.5)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class JobProgress:
    """A console (supervise.Console's line and say) that folds the workers' progress lines into
    one line for the job. Thread-safety: line() may be called from every reader thread."""

    def __init__(self, console, num_workers, clock=time.monotonic):
        self.console, self.num_workers, self.clock = console, num_workers, clock
        self.lock = threading.Lock()
        self.latest = {}   # rank -> (step, total, examples/s or None, loss or None)
        self.shown = None  # the job step of the last line printed
        self.first = None  # (time, job step) of the first line printed: the pace since then

    def say(self, msg, err=False):
        self.console.say(msg, err)

    def line(self, text, err=False):
        m = PROGRESS_LINE.match(text)
        if not m:
            self.console.line(text, err)
            return
        rank, step, total, rest = int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)
        eps, loss = EXAMPLES_PER_S.search(rest), LOSS.search(rest)
        with self.lock:
            self.latest[rank] = (step, total, float(eps.group(1)) if eps else None,
                                 float(loss.group(1)) if loss else None)
            job_line = self._job_line()
        if job_line:
            self.console.line(job_line, err)

    def _job_line(self):
        """The job's line when every worker has reported and the slowest has moved on; else None."""
        if len(self.latest) < self.num_workers:
            return None
        steps = [s for s, _, _, _ in self.latest.values()]
        low, high = min(steps), max(steps)
        if self.shown is not None and low <= self.shown:
            return None
        self.shown = low
        total = max(t for _, t, _, _ in self.latest.values())
        now = self.clock()
        if self.first is None:
            self.first = (now, low)
        parts = []
        rates = [e for _, _, e, _ in self.latest.values() if e is not None]
        if rates:
            parts.append(f"{sum(rates):.0f} examples/s in all")
        losses = [x for _, _, _, x in self.latest.values() if x is not None]
        if losses:
            parts.append(f"mean loss {sum(losses) / len(losses):.4f}")
        t0, step0 = self.first
        if low > step0 and now > t0:
            parts.append("ETA " + duration((now - t0) / (low - step0) * max(total - low, 0)))
        where = f"workers at {low}" if low == high else f"workers at {low}-{high}"
        return f"[job] step {low}/{total} ({where})" + (": " + ", ".join(parts) if parts else "")
