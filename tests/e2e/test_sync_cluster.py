"""Sync mode end to end: real ferry-ps and ferry-trainer processes on tcp loopback.

Needs FERRY_BUILD_DIR (the CMake build dir); ctest sets it. Run by hand:
  FERRY_BUILD_DIR=build python3 -m unittest -v test_sync_cluster   (from tests/e2e/)

Every process is started by the test, on 127.0.0.1, with a deadline, and killed at the end.
"""

import json
import os
import re
import subprocess
import tempfile
import unittest

from build_paths import PS_BIN, TRAINER_BIN

# A small CTR job whose workers touch very few ids a step (2 fields, batch 2): with 4 servers,
# most servers get no id from a given worker in a given step.
FEW_IDS_CTR = ["--model", "ctr", "--batch", "2", "--ctr-fields", "2", "--ctr-train", "20000",
               "--ctr-test", "1000", "--consistency", "sync", "--log-every", "100000",
               "--blas-threads", "1"]


class Servers:
    """ferry-ps processes on 127.0.0.1 with free ports; stopped (SIGKILL after SIGTERM) on exit."""

    def __init__(self, n, max_wait_s=60, ps_bin=PS_BIN, extra_args=()):
        self.procs, self.endpoints = [], []
        for r in range(n):
            p = subprocess.Popen([ps_bin, "--bind", "tcp://127.0.0.1:0", "--rank", str(r),
                                  "--num-servers", str(n), "--compute-threads", "1",
                                  "--max-wait-s", str(max_wait_s)] + list(extra_args),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self.procs.append(p)
            line = p.stdout.readline()
            m = re.search(r"(tcp://\S+)", line)
            if not m:
                self.stop()
                raise RuntimeError(f"ferry-ps {r} did not report its endpoint: {line!r}")
            self.endpoints.append(m.group(1))

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            p.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_worker(servers, rank, num_workers, args, metrics):
    return subprocess.Popen([TRAINER_BIN, "--servers", ",".join(servers.endpoints), "--rank", str(rank),
                             "--num-workers", str(num_workers), "--device", "cpu",
                             "--metrics-out", metrics] + args,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_workers(servers, num_workers, args_of_rank, tmp, tag, timeout=120):
    """Runs one trainer per rank; returns [(returncode, output, end_event)]."""
    procs = []
    for r in range(num_workers):
        metrics = os.path.join(tmp, f"{tag}-{r}.jsonl")
        procs.append((start_worker(servers, r, num_workers, args_of_rank(r), metrics), metrics))
    results = []
    for p, metrics in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q, _ in procs:
                q.kill()
            raise
        end = None
        if os.path.exists(metrics):
            with open(metrics) as f:
                for line in f:
                    ev = json.loads(line)
                    if ev["event"] == "start":
                        blas_threads = ev["blas_threads"]
                    if ev["event"] == "end":
                        end = dict(ev, blas_threads=blas_threads)
        results.append((p.returncode, out, end))
        p.stdout.close()
    return results


@unittest.skipUnless(os.path.exists(PS_BIN) and os.path.exists(TRAINER_BIN), "ferry-ps / ferry-trainer not built")
class SyncClusterTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ferry-sync-test-")

    def test_ctr_with_fewer_ids_than_servers_never_aborts_and_repeats_bitwise(self):
        # Before the sparse sync step was defined (pulls to every server), this job aborted with
        # "push for step N but the table is at step N-1" within a few hundred steps.
        finals = []
        for run in range(2):
            with Servers(4) as s:
                res = run_workers(s, 2, lambda r: FEW_IDS_CTR + ["--steps", "1500"], self.tmp, f"run{run}")
            for rc, out, end in res:
                self.assertEqual(rc, 0, out)
                self.assertNotIn("but the table is at step", out)
                self.assertEqual(end["pushes_used"], 1500, out)
                self.assertEqual(end["blas_threads"], 1)  # as asked (FEW_IDS_CTR), and recorded
            finals.append(res[0][2]["final"])
        # Sync without backup workers is bitwise reproducible run to run (same machine, same
        # BLAS threads): the final metrics, printed with 9 significant digits, are equal.
        self.assertEqual(finals[0], finals[1])

    def test_a_worker_with_fewer_steps_does_not_hold_the_others(self):
        # Worker 1 runs 40 steps, worker 0 runs 120. The servers hold a pull at most 20 s: if
        # worker 0's steps 40.. waited for worker 1, its pulls would fail after 20 s.
        with Servers(2, max_wait_s=20) as s:
            res = run_workers(s, 2, lambda r: FEW_IDS_CTR + ["--steps", "120" if r == 0 else "40"],
                              self.tmp, "uneven", timeout=100)
        for rc, out, end in res:
            self.assertEqual(rc, 0, out)
            self.assertIn(" epoch 1/1:", out)  # epochs are counted from 1
        self.assertEqual(res[0][2]["pushes_used"], 120)
        self.assertEqual(res[1][2]["pushes_used"], 40)
        self.assertEqual(res[0][2]["global_step"], 119)  # its last push counted for step 119

    def test_a_second_job_on_the_same_servers_joins_at_their_step(self):
        # Running the same job again against servers that are still up must train (or be
        # refused), never exit 0 with every gradient dropped as late.
        with Servers(2) as s:
            args = FEW_IDS_CTR + ["--steps", "50"]
            first = run_workers(s, 2, lambda r: args, self.tmp, "first")
            for rc, out, _ in first:
                self.assertEqual(rc, 0, out)
            second = run_workers(s, 2, lambda r: args, self.tmp, "second")
        for rc, out, end in second:
            self.assertEqual(rc, 0, out)
            self.assertIn("already at global step 50", out)
            self.assertEqual(end["pushes_used"], 50)
            self.assertEqual(end["pushes_dropped"], 0)
            self.assertEqual(end["global_step"], 99)

    def test_backup_workers_do_not_hold_the_fast_worker_back(self):
        # 2 workers, one backup (each step aggregates the first gradient), worker 1 sleeps 100 ms
        # a step (far more than a fast step, so that the bounds below hold on a loaded machine). Neither the steps nor the evaluations (worker 0 alone, not merged: a collective
        # would wait for the straggler) may make worker 0 wait for it; only the closing barrier.
        # The 40 steps are the job's (global steps): the straggler stops when the job reaches them.
        with Servers(2) as s:
            res = run_workers(s, 2, lambda r: FEW_IDS_CTR + ["--steps", "40", "--backup-workers", "1",
                                                          "--straggler", "1:100ms", "--eval-every", "10"],
                              self.tmp, "backup")
        for rc, out, end in res:
            self.assertEqual(rc, 0, out)
            # Every first pull is served at the job's first step (the workers meet after it):
            # a fast worker has not moved the job on before the straggler's first pull.
            self.assertNotIn("already at global step", out)
            # Every step a worker ran pushed once: used, or dropped as late.
            self.assertEqual(end["pushes_used"] + end["pushes_dropped"], end["steps"], str(end))
        fast, slow = res[0][2], res[1][2]
        # Each global step took one gradient, so the job ran 40 of them between the two workers:
        # nearly all the fast worker's (all 40 unless it stalled for 100 ms somewhere, as a loaded
        # machine can make it: then the straggler's gradient closed that step and the job reached
        # its end that much sooner).
        self.assertEqual(fast["pushes_used"] + slow["pushes_used"], 40, (fast, slow))
        self.assertGreaterEqual(fast["steps"], 30, str(fast))
        self.assertIn(fast["global_step"], (39, 40), str(fast))  # its last push counted for step 39, or the job ended first
        self.assertEqual(slow["global_step"], 40, str(slow))  # served the job's end, it stopped
        self.assertIn("the job reached its 40 steps (global step 40) after", res[1][1])
        self.assertLessEqual(slow["steps"], 40, str(slow))
        with open(os.path.join(self.tmp, "backup-0.jsonl")) as f:
            evals = [json.loads(l) for l in f if '"eval"' in l]
        self.assertEqual(len(evals), 4, evals)  # steps 10, 20, 30 and the end
        self.assertTrue(all(e["merged"] is False for e in evals), evals)
        # A quorum of 1: its own gradient makes nearly every step (the straggler's could come
        # first only if the fast worker stalled for its 100 ms).
        self.assertGreaterEqual(fast["pushes_used"], 30, str(fast))
        # Had it waited for the straggler in its steps it would have waited about 40 x 100 ms.
        self.assertLess(fast["time"]["wait_s"] - fast["final_wait_s"], 0.5 * 40 * 0.100, str(fast))
        # Nor at the end: the straggler stops at the job's end instead of running its own 40
        # steps (another 40 x 100 ms) alone; at most one step of its (100 ms + a step) remains.
        self.assertLess(fast["final_wait_s"], 0.5 * 40 * 0.100, str(fast))

    def test_times_add_up_to_the_wall_time_and_sync_wait_is_measured(self):
        # Worker 1 sleeps 30 ms a step: worker 0 waits for it in every sync step, and that shows
        # as wait_s (measured by the servers), not as pull or compute time.
        with Servers(2) as s:
            res = run_workers(s, 2, lambda r: FEW_IDS_CTR + ["--steps", "40", "--straggler", "1:30ms"],
                              self.tmp, "times")
        for rc, out, end in res:
            self.assertEqual(rc, 0, out)
            t = end["time"]
            parts = t["pull_s"] + t["compute_s"] + t["push_s"] + t["wait_s"] + t["eval_s"]
            self.assertAlmostEqual(parts, end["wall_s"], delta=0.02 * end["wall_s"], msg=str(end))
        fast, slow = res[0][2]["time"], res[1][2]["time"]
        # 40 steps of a 30 ms delay: the fast worker waited for most of it.
        self.assertGreater(fast["wait_s"], 0.5 * 40 * 0.030, msg=str(fast))
        self.assertGreater(slow["compute_s"], 40 * 0.030, msg=str(slow))


if __name__ == "__main__":
    unittest.main()
