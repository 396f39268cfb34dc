"""A worker that dies or hangs, with real ferry-ps and ferry-trainer processes on tcp loopback.

The servers notice a worker that fell silent (ferry-ps --worker-timeout-s; the trainers' clients
send heartbeats): the other workers fail within seconds, naming it, instead of after the servers'
five-minute --max-wait-s; and a server whose workers are all gone says so. A worker killed with
SIGKILL and started again with --resume takes up the job where it was.

Needs FERRY_BUILD_DIR (the CMake build dir); ctest sets it. Every process is started by the test,
on 127.0.0.1, with a deadline, and killed at the end.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

from build_paths import PS_BIN, TRAINER_BIN

DEADLINE_S = 60  # any one wait in these tests

MLP = ["--model", "mlp", "--hidden", "32", "--optimizer", "adam", "--lr", "0.001", "--batch", "32",
       "--train-limit", "2000", "--test-limit", "500", "--consistency", "sync", "--log-every", "10",
       "--blas-threads", "1", "--device", "cpu"]


class Job:
    """ferry-ps and ferry-trainer processes of one job; everything left is killed on exit."""

    def __init__(self, tmp, num_servers, ps_args=()):
        self.tmp, self.procs, self.endpoints, self.ps, self.files = tmp, [], [], [], []
        for r in range(num_servers):
            log = open(os.path.join(tmp, f"ps{r}.log"), "w+")
            self.files.append(log)
            p = subprocess.Popen([PS_BIN, "--bind", "tcp://127.0.0.1:0", "--rank", str(r), "--num-servers",
                                  str(num_servers), "--compute-threads", "1"] + list(ps_args),
                                 stdout=log, stderr=subprocess.STDOUT)
            self.procs.append(p)
            self.ps.append((p, log))
            self.endpoints.append(self._endpoint(log, p))

    @staticmethod
    def _endpoint(log, p):
        end = time.monotonic() + 10
        while time.monotonic() < end:
            log.seek(0)
            m = re.search(r"listening on (tcp://\S+)", log.read())
            if m:
                return m.group(1)
            if p.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError("ferry-ps did not report its endpoint")

    def worker(self, rank, num_workers, args):
        metrics = os.path.join(self.tmp, f"w{rank}-{len(self.procs)}.jsonl")
        out = open(os.path.join(self.tmp, f"w{rank}-{len(self.procs)}.log"), "w+")
        self.files.append(out)
        p = subprocess.Popen([TRAINER_BIN, "--servers", ",".join(self.endpoints), "--rank", str(rank),
                              "--num-workers", str(num_workers), "--metrics-out", metrics] + args,
                             stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p, out, metrics

    def server_output(self, r):
        p, log = self.ps[r]
        log.seek(0)
        return log.read()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            if p.poll() is None:
                p.kill()  # SIGKILL also ends a stopped process
        for p in self.procs:
            p.wait(timeout=DEADLINE_S)
        for f in self.files:
            f.close()


def read(f):
    f.seek(0)
    return f.read()


def wait_for(what, cond):
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {DEADLINE_S} s waiting for {what}")


def train_steps(metrics):
    """The highest step of the worker's train events so far."""
    if not os.path.exists(metrics):
        return 0
    step = 0
    with open(metrics) as f:
        for line in f:
            if line.endswith("\n"):
                ev = json.loads(line)
                if ev["event"] == "train":
                    step = max(step, ev["step"])
    return step


def start_two_and_kill_worker_1(job, steps):
    """Starts workers 0 and 1 on the MLP and SIGKILLs worker 1 once it has trained 40 steps:
    worker 0's (process, output, metrics) and worker 1's last train step."""
    w0, out0, m0 = job.worker(0, 2, MLP + ["--steps", str(steps)])
    w1, _, m1 = job.worker(1, 2, MLP + ["--steps", str(steps)])
    wait_for("worker 1 to train 40 steps", lambda: train_steps(m1) >= 40)
    os.kill(w1.pid, signal.SIGKILL)
    w1.wait(timeout=DEADLINE_S)
    return (w0, out0, m0), train_steps(m1)


@unittest.skipUnless(os.path.exists(PS_BIN) and os.path.exists(TRAINER_BIN), "ferry-ps / ferry-trainer not built")
class WorkerDeathTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ferry-worker-death-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_a_stopped_worker_is_named_within_seconds_and_the_servers_say_the_job_is_gone(self):
        with Job(self.tmp, 2, ["--worker-timeout-s", "1", "--max-wait-s", "300"]) as job:
            w0, out0, m0 = job.worker(0, 2, MLP + ["--steps", "1000000"])
            w1, out1, m1 = job.worker(1, 2, MLP + ["--steps", "1000000"])
            wait_for("worker 1 to train 20 steps", lambda: train_steps(m1) >= 20)
            os.kill(w1.pid, signal.SIGSTOP)
            stopped = time.monotonic()
            rc = w0.wait(timeout=DEADLINE_S)
            took = time.monotonic() - stopped
            text = read(out0)
            print(f"worker 0 ended {took:.1f} s after worker 1 was stopped (exit {rc})")
            self.assertNotEqual(rc, 0, text)
            self.assertIn("UNAVAILABLE", text)
            self.assertIn("worker 1 has sent nothing for", text)
            self.assertNotIn("DEADLINE_EXCEEDED", text)  # named by the servers, not timed out
            # Worker 0 is gone too: both are silent, and each server says its job looks gone.
            for r in range(2):
                wait_for(f"server {r} to say the job is gone",
                         lambda: "the job looks gone" in job.server_output(r))

    def test_a_killed_worker_restarted_with_resume_takes_up_the_job(self):
        # Sync, no backup workers: the survivor waits for the killed worker's gradient; the
        # restarted process rejoins at the global step, and the job ends with both at its last step.
        steps = 300
        with Job(self.tmp, 2, ["--worker-timeout-s", "30"]) as job:
            (w0, out0, m0), last_event = start_two_and_kill_worker_1(job, steps)
            # A train event for step s (counted from 1) follows the gradient of global step s - 1
            # into ZeroMQ's queue, which the SIGKILL may empty before it is sent; the step before it
            # had closed (its values were that gradient's input), so the job is at s - 1 at least.
            self.assertLess(train_steps(m0), steps, "the job must not be over yet: the survivor waits for the dead")
            w1b, out1b, m1b = job.worker(1, 2, MLP + ["--steps", str(steps), "--resume"])
            for p, out in ((w0, out0), (w1b, out1b)):
                self.assertEqual(p.wait(timeout=DEADLINE_S), 0, read(out))
            text = read(out1b)
            m = re.search(r"resuming the job at step (\d+) of 300", text)
            self.assertIsNotNone(m, text)
            self.assertGreaterEqual(int(m.group(1)), last_event - 1)
            ends = []
            for metrics in (m0, m1b):
                with open(metrics) as f:
                    ends.append([json.loads(line) for line in f if '"end"' in line][-1])
            # Both pushed the job's last step (global steps count from 0).
            self.assertEqual(ends[0]["global_step"], steps - 1)
            self.assertEqual(ends[1]["global_step"], steps - 1)
            self.assertEqual(ends[1]["first_step"], int(m.group(1)))
            self.assertEqual(ends[1]["steps"], steps - int(m.group(1)))

    def test_a_worker_restarted_without_resume_is_told_so_and_nothing_waits_for_ever(self):
        # Restarted by hand without --resume, worker 1 waits for the others at the job's start
        # barrier, while worker 0's step waits for worker 1's gradient. Before, both waited out the
        # servers' --max-wait-s (300 s). Server 0 sees the cycle and fails the barrier, saying to
        # use --resume (a fresh worker's start barrier says it starts, protocol 1.12); worker 1 exits with that, and worker 0, whose step then lacks a gradient
        # from a silent worker, fails naming it.
        steps = 300
        # Worker 0 gives up on the killed worker 1 after 20 s (not the default 10): the restarted
        # one must be up before that, and a start-up on a loaded machine can take longer than 10 s.
        with Job(self.tmp, 2, ["--max-wait-s", "300", "--worker-timeout-s", "20"]) as job:
            (w0, out0, m0), _ = start_two_and_kill_worker_1(job, steps)
            w1b, out1b, _ = job.worker(1, 2, MLP + ["--steps", str(steps)])  # no --resume
            rc = w1b.wait(timeout=DEADLINE_S)
            text = read(out1b)
            self.assertNotEqual(rc, 0, text)
            self.assertIn("FAILED_PRECONDITION", text)
            # Server 0 sees the cycle by worker 0's pull held there, or, where worker 1 was killed
            # between its pushes to the two servers (server 0's step closed, worker 0's pull is
            # held on server 1), by worker 0 training while worker 1 starts over.
            self.assertRegex(text, r"Barrier \d+ on server 0: worker\(s\) 1 wait here, but (worker 0's \w+ for step "
                                   r"\d+ waits for their gradients|worker 1 waits at the job's start, and worker 0 is "
                                   r"training already)")
            self.assertIn("must be started with --resume", text)
            self.assertNotEqual(w0.wait(timeout=DEADLINE_S), 0)
            text0 = read(out0)
            self.assertIn("worker 1 has sent nothing for", text0)
            self.assertNotIn("DEADLINE_EXCEEDED", text + text0)

    def test_with_backup_workers_the_job_goes_on_without_a_killed_worker(self):
        # 3 workers, each step aggregates 2: worker 2 is killed and not restarted; the others
        # train on and finish, their closing barrier completing without it once it is silent.
        steps = 200
        args = MLP + ["--steps", str(steps), "--backup-workers", "1"]
        with Job(self.tmp, 1, ["--worker-timeout-s", "1"]) as job:
            ws = [job.worker(r, 3, args) for r in range(3)]
            wait_for("worker 2 to train 20 steps", lambda: train_steps(ws[2][2]) >= 20)
            os.kill(ws[2][0].pid, signal.SIGKILL)
            for p, out, _ in ws[:2]:
                self.assertEqual(p.wait(timeout=DEADLINE_S), 0, read(out))
            for _, _, metrics in ws[:2]:
                with open(metrics) as f:
                    end = [json.loads(line) for line in f if '"end"' in line][-1]
                # The job reached its last step (a worker whose push came late stops at the
                # global step the others took the job to).
                self.assertGreaterEqual(end["global_step"], steps - 1)
            self.assertIn("completes without worker(s) 2", job.server_output(0))

    def test_a_diverging_sync_job_ends_at_once_naming_the_refused_gradient(self):
        # lr 1e30: the first update blows the weights up, and the next gradients hold NaN, which
        # the servers refuse. Each worker must end at once with that refusal (the worker, the
        # table, the element), and exit 2: a restart would compute the same gradient again.
        # Before, it sent its next pulls anyway and waited for a step that could not close, until
        # the servers' --max-wait-s (300 s here) ended them with a timeout naming no cause.
        with Job(self.tmp, 2, ["--max-wait-s", "300"]) as job:
            args = MLP + ["--steps", "100", "--optimizer", "sgd", "--lr", "1e30"]
            workers = [job.worker(r, 2, args) for r in range(2)]
            for p, out, _ in workers:
                rc = p.wait(timeout=DEADLINE_S)  # well inside the servers' 300 s
                text = read(out)
                self.assertEqual(rc, 2, text)
                self.assertRegex(text, r"table 'mlp/\w+' chunk \d+: the gradient of worker \d holds NaN or Inf "
                                       r"\(element \d+\)")
                self.assertNotIn("DEADLINE_EXCEEDED", text)
                self.assertNotIn("waiting", text)  # no long wait was ever reported
            self.assertIn("holds NaN or Inf", job.server_output(0) + job.server_output(1))


if __name__ == "__main__":
    unittest.main()
