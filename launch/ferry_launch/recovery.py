"""Recovery bookkeeping for the local and ssh backends: what the processes' output says about
the job (steps reached, checkpoints saved, resumes), one record per restart, and the report.

The lines read are those ferry-trainer and ferry-ps print:
  [worker R] step T/TOTAL epoch ...                 progress (every --log-every steps)
  [worker 0] checkpoint of step S saved: ...        a complete checkpoint of the job
  [worker R] resuming the job at step S of TOTAL    a --resume worker has joined at step S
                                                    ("of TOTAL of its own": S counts this
                                                    worker's own steps, async/ssp; else the
                                                    job's global step)
  ferry-ps rank R: restored the checkpoint of step S from DIR
"""

import re
import threading
import time

PROGRESS_RE = re.compile(r"^\[worker \d+\] step (\d+)/\d+ ")
SAVED_RE = re.compile(r"^\[worker \d+\] checkpoint of step (\d+) saved")
RESUMING_RE = re.compile(r"^\[worker \d+\] resuming the job at step (\d+) of \d+( of its own)?")
RESTORED_RE = re.compile(r"^ferry-ps rank \d+: restored the checkpoint of step (\d+) from ")


class JobWatch:
    """Reads the output lines of every process (called from their reader threads) for the job's
    progress. Per process (a TaskProc): last_step, the highest step its lines reported. For the
    job: checkpoint, the step of its newest checkpoint (saved by this job, or restored from);
    None while it has none. A "resuming" line also posts ("resumed", proc, step, time seen,
    own) on the launcher's event queue (own: the step counts the worker's own steps).
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
            self.events.put(("resumed", proc, step, now, m.group(2) is not None))

    def last_steps(self, procs):
        """{task name: the highest step its proc reported, or None}."""
        with self.lock:
            return {p.task.name: p.last_step for p in procs}

    def checkpoint_step(self):
        with self.lock:
            return self.checkpoint


class Recovery:
    """One restart: who died and how, what was restarted, and, once every restarted worker has
    said "resuming the job at step S", where each resumed, the steps lost and the time it took.

    before: {worker name: the last step it reported before the death, or None}: the dead
    worker (kind "worker": restarted alone), or every worker (kind "server": every process
    restarted from the checkpoint; kind "replaced": a server of a --replication 2 job restarted
    alone with --recover, while the workers, restarted by none, wait for it). A worker that a
    recovery restarted but that died again before it said where it resumed carries its step
    from that recovery (inherit): its loss is counted once, by the recovery that completes.

    Steps lost: the work the job does again. When the workers count the job's global step
    (sync), the highest step before the death less the lowest resumed at (a sync worker
    restarted alone rejoins at the global step and loses none). When each counts its own (the
    "resuming" line says "of its own": async, ssp), the sum over the workers of each one's own
    step before less the one it resumed at, in worker-steps. Recovery time: from the launcher
    noticing the death (the dead process reaped) to the last restarted worker's "resuming" line.

    A replaced server (kind "replaced") waits for no "resuming" line (waiting is empty): it is
    complete once its replacement says it listens (up(): ferry-ps's "listening on" line, printed
    once it took the dead one's state from the replicas and serves), and loses no step: the
    workers go on from where they were."""

    def __init__(self, number, kind, dead, how, restarted, noticed, before, waiting):
        self.number, self.kind, self.dead, self.how = number, kind, dead, how
        self.restarted, self.noticed = restarted, noticed
        self.before = dict(before)  # worker name -> step or None
        self.waiting = set(waiting)  # names of the workers whose "resuming" line is awaited
        self.at = {}        # worker name -> the step it resumed at
        self.own = False    # a resumed step counts the worker's own steps
        self.done_at = None

    def up(self, when):
        """A replaced server's replacement said it listens (kind "replaced"): complete."""
        self.done_at = when

    def inherit(self, superseded, only=None):
        """Takes, for each worker superseded restarted but never heard resume (only: that one),
        its step from before superseded's death (where this recovery has none)."""
        for name in ([only] if only else superseded.waiting):
            if self.before.get(name) is None and superseded.before.get(name) is not None:
                self.before[name] = superseded.before[name]

    def resumed(self, name, step, when, own=False):
        """A restarted worker said it resumes at step; True when it was the last awaited."""
        if name not in self.waiting:
            return False
        self.waiting.discard(name)
        self.at[name] = step
        self.own = self.own or own
        if self.waiting:
            return False
        self.done_at = when
        return True

    @property
    def step(self):
        """The step the job resumed at: the lowest any restarted worker said (None: none yet)."""
        return min(self.at.values()) if self.at else None

    @property
    def seconds(self):
        return None if self.done_at is None else max(0.0, self.done_at - self.noticed)

    @property
    def lost(self):
        if self.kind == "replaced":
            return None if self.done_at is None else 0
        if self.step is None:
            return None
        if self.own:
            return sum(max(0, b - self.at[n]) for n, b in self.before.items()
                       if b is not None and n in self.at)
        reported = [b for b in self.before.values() if b is not None]
        return max(0, (max(reported) if reported else self.step) - self.step)

    def _lost_text(self):
        reported = {n: b for n, b in self.before.items() if b is not None}
        if not reported:
            return f"steps lost: {self.lost} (no step reported before)"
        if self.own:
            each = ", ".join(f"{n} {self.before.get(n) if self.before.get(n) is not None else '(none)'} -> "
                             f"{at}" for n, at in sorted(self.at.items()))
            return (f"steps lost: {self.lost}, of the workers' own steps (each worker's last "
                    f"step reported before the death -> the step it resumed at: {each})")
        return (f"steps lost: {self.lost} (last step "
                f"{'it' if self.kind == 'worker' else 'a worker'} reported before the death: "
                f"{max(reported.values())})")

    def _before_text(self):
        return ", ".join(f"{n} {b if b is not None else '(none)'}" for n, b in sorted(self.before.items()))

    def report(self, limit):
        """The line printed when the recovery is complete."""
        if self.kind == "replaced":
            return (f"recovery {self.number} of at most {limit}: {self.dead} died ({self.how}); "
                    f"restarted {self.restarted}; its replacement is up (it took the dead one's "
                    "state from the replicas and listens), and the workers, restarted by none, go "
                    "on where they were (their last steps reported before the death: "
                    f"{self._before_text() or 'none'}); steps lost: 0; recovery "
                    f"time {self.seconds:.2f} s (from noticing the death to the replacement's "
                    "'listening on' line)")
        if self.kind == "worker":
            where = f"it rejoined the job at step {self.step}"
        elif self.own:
            where = ("each worker resumed at its own step in the checkpoint restored (the lowest: "
                     f"{self.step})")
        else:
            where = f"the job resumed at step {self.step}, the step of the checkpoint restored"
        return (f"recovery {self.number} of at most {limit}: {self.dead} died ({self.how}); "
                f"restarted {self.restarted}; {where}; {self._lost_text()}; "
                f"recovery time {self.seconds:.2f} s (from noticing the death to the "
                f"{'restarted worker' if self.kind == 'worker' else 'last restarted worker'}'s "
                "'resuming the job' line)")

    def unfinished(self, why, counted_later=False):
        """The line printed when the recovery did not complete; counted_later: the next
        recovery counts its steps lost."""
        waiting = ", ".join(sorted(self.waiting))
        if self.kind == "replaced":
            return (f"recovery {self.number}: {self.dead} died ({self.how}); restarted "
                    f"{self.restarted}; not complete ({why}; the replacement never said it "
                    "listens)")
        return (f"recovery {self.number}: {self.dead} died ({self.how}); restarted "
                f"{self.restarted}; not complete ({why}; no 'resuming the job' line from "
                f"{waiting})" + ("; its steps lost are counted by the next recovery"
                                 if counted_later else ""))


def summary(recoveries, limit):
    """The recovery summary at the end of a run with restarts: one line."""
    workers = sum(1 for r in recoveries if r.kind == "worker")
    servers = len(recoveries) - workers
    replaced = sum(1 for r in recoveries if r.kind == "replaced")
    done = [r for r in recoveries if r.done_at is not None]
    lost = sum(r.lost for r in done)
    times = ", ".join(f"{r.seconds:.2f} s" for r in done)
    alone = f", {replaced} of them replaced alone with --recover" if replaced else ""
    text = (f"recovery summary: {len(recoveries)} restart{'s' if len(recoveries) != 1 else ''} "
            f"of at most {limit} ({workers} after a worker died, {servers} after a server "
            f"died{alone}); steps lost: {lost}" + (" (async/ssp: in the workers' own steps)"
                                                  if any(r.own for r in done) else ""))
    if done:
        text += f"; recovery time {sum(r.seconds for r in done):.2f} s in all ({times})"
    if len(done) < len(recoveries):
        text += f"; {len(recoveries) - len(done)} not complete"
    return text
