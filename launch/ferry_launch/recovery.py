"""Recovery bookkeeping for the local and ssh backends: what the processes' output says about
the job (steps reached, checkpoints saved, resumes), one record per restart, and the report.

The lines read are those ferry-trainer and ferry-ps print:
  [worker R] step T/TOTAL epoch ...                 progress (every --log-every steps)
  [worker 0] checkpoint of step S saved: ...        a complete checkpoint of the job
  [worker R] resuming the job at step S of TOTAL    a --resume worker has joined at step S
  ferry-ps rank R: restored the checkpoint of step S from DIR
"""

import re
import threading
import time

PROGRESS_RE = re.compile(r"^\[worker \d+\] step (\d+)/\d+ ")
SAVED_RE = re.compile(r"^\[worker \d+\] checkpoint of step (\d+) saved")
RESUMING_RE = re.compile(r"^\[worker \d+\] resuming the job at step (\d+) of \d+")
RESTORED_RE = re.compile(r"^ferry-ps rank \d+: restored the checkpoint of step (\d+) from ")


class JobWatch:
    """Reads the output lines of every process (called from their reader threads) for the job's
    progress. Per process (a TaskProc): last_step, the highest step its lines reported. For the
    job: checkpoint, the step of its newest checkpoint (saved by this job, or restored from);
    None while it has none. A "resuming" line also posts ("resumed", proc, step, time seen) on
    the launcher's event queue.
    Thread-safety: see() from any thread; the fields are read under `lock`."""

    def __init__(self, events):
        self.lock = threading.Lock()
        self.events = events
        self.checkpoint = None  # guarded by lock

    def see(self, proc, text):
        now = time.monotonic()
        if proc.task.role == "ps":
            m = RESTORED_RE.match(text)
            if m:
                with self.lock:
                    self.checkpoint = int(m.group(1))
            return
        m = PROGRESS_RE.match(text) or SAVED_RE.match(text) or RESUMING_RE.match(text)
        if not m:
            return
        step = int(m.group(1))
        with self.lock:
            proc.last_step = step if proc.last_step is None else max(proc.last_step, step)
            if m.re is SAVED_RE:
                self.checkpoint = step
        if m.re is RESUMING_RE:
            self.events.put(("resumed", proc, step, now))

    def last_step(self, procs):
        """The highest step any of procs reported; None when none did."""
        with self.lock:
            steps = [p.last_step for p in procs if p.last_step is not None]
        return max(steps) if steps else None

    def checkpoint_step(self):
        with self.lock:
            return self.checkpoint


class Recovery:
    """One restart: who died and how, what was restarted, and, once every restarted worker has
    said "resuming the job at step S", the step, the steps lost and the time it took.

    kind "worker": one worker restarted alone; before = the last step it reported. kind
    "server": every process restarted from the checkpoint; before = the highest step any worker
    reported. Steps lost = before - S (at least 0): the work the job does again (sync: a worker
    restarted alone rejoins at the global step and loses none). Recovery time: from the launcher
    noticing the death (the dead process reaped) to the last restarted worker's "resuming"
    line."""

    def __init__(self, number, kind, dead, how, restarted, noticed, before, waiting):
        self.number, self.kind, self.dead, self.how = number, kind, dead, how
        self.restarted, self.noticed, self.before = restarted, noticed, before
        self.waiting = set(waiting)  # names of the workers whose "resuming" line is awaited
        self.step = None    # the step the job resumed at (the lowest any worker said)
        self.done_at = None

    def resumed(self, name, step, when):
        """A restarted worker said it resumes at step; True when it was the last awaited."""
        if name not in self.waiting:
            return False
        self.waiting.discard(name)
        self.step = step if self.step is None else min(self.step, step)
        if self.waiting:
            return False
        self.done_at = when
        return True

    @property
    def seconds(self):
        return None if self.done_at is None else max(0.0, self.done_at - self.noticed)

    @property
    def lost(self):
        if self.step is None:
            return None
        return max(0, (self.before if self.before is not None else self.step) - self.step)

    def report(self, limit):
        """The line printed when the recovery is complete."""
        before = ("no step reported before" if self.before is None else
                  f"last step {'it' if self.kind == 'worker' else 'a worker'} reported before "
                  f"the death: {self.before}")
        if self.kind == "worker":
            where = f"it rejoined the job at step {self.step}"
        else:
            where = f"the job resumed at step {self.step}, the step of the checkpoint restored"
        return (f"recovery {self.number} of at most {limit}: {self.dead} died ({self.how}); "
                f"restarted {self.restarted}; {where}; steps lost: {self.lost} ({before}); "
                f"recovery time {self.seconds:.2f} s (from noticing the death to the "
                f"{'restarted worker' if self.kind == 'worker' else 'last restarted worker'}'s "
                "'resuming the job' line)")

    def unfinished(self, why):
        """The line printed when the recovery did not complete."""
        waiting = ", ".join(sorted(self.waiting))
        return (f"recovery {self.number}: {self.dead} died ({self.how}); restarted "
                f"{self.restarted}; not complete ({why}; no 'resuming the job' line from "
                f"{waiting})")


def summary(recoveries, limit):
    """The recovery summary at the end of a run with restarts: one line."""
    workers = sum(1 for r in recoveries if r.kind == "worker")
    servers = len(recoveries) - workers
    done = [r for r in recoveries if r.done_at is not None]
    lost = sum(r.lost for r in done)
    times = ", ".join(f"{r.seconds:.2f} s" for r in done)
    text = (f"recovery summary: {len(recoveries)} restart{'s' if len(recoveries) != 1 else ''} "
            f"of at most {limit} ({workers} after a worker died, {servers} after a server died); "
            f"steps lost: {lost}")
    if done:
        text += f"; recovery time {sum(r.seconds for r in done):.2f} s in all ({times})"
    if len(done) < len(recoveries):
        text += f"; {len(recoveries) - len(done)} not complete"
    return text
