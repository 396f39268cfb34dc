"""examples/dlrm.py through ferry-launch, as a user runs it: 2 ferry-ps x 2 worker processes on
127.0.0.1, the workers a Python program (ferry.torch). The DLRM reaches the planted model's test
AUC within 0.01 on the synthetic CTR data; a job checkpoints and a second launch resumes it from
the servers' checkpoint; the hybrid (dense layers under DDP, embeddings on Ferry) trains; the
README's examples/quickstart.py runs.

Needs FERRY_BUILD_DIR (ctest sets it) and Debian's python3 with python3-torch. Run by hand, from
tests/e2e/:  FERRY_BUILD_DIR=../../build /usr/bin/python3 -m unittest -v test_torch_dlrm
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import unittest

from build_paths import BUILD_DIR, HERE

TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
LAUNCHER = os.path.join(TOP, "launch", "ferry-launch")
DLRM = os.path.join(TOP, "examples", "dlrm.py")
FINAL_RE = re.compile(r"^\[worker 0\] final: (.*)$", re.M)


def launch(args, program_args, timeout=240):
    """Runs ferry-launch ARGS -- python3 dlrm.py PROGRAM_ARGS; returns (exit status, output)."""
    cmd = [sys.executable, LAUNCHER, "--bin-dir", BUILD_DIR, "--base-port", "0"] + args + \
        ["--", sys.executable, DLRM, "--threads", "1", "--log-every", "100"] + program_args
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, cwd=TOP)
    return p.returncode, p.stdout


def final(out):
    m = FINAL_RE.search(out)
    if not m:
        return None
    words = m.group(1).split()
    return {k: float(v) for k, v in zip(words[::2], words[1::2])}


class DlrmTest(unittest.TestCase):
    def test_two_by_two_reaches_the_planted_auc(self):
        rc, out = launch(["--num-ps", "2", "--num-workers", "2"], ["--steps", "1500"])
        self.assertEqual(rc, 0, out[-3000:])
        f = final(out)
        self.assertIsNotNone(f, out[-3000:])
        self.assertEqual(f["steps"], 1500)
        self.assertGreater(f["planted_auc"], 0.8)
        self.assertGreaterEqual(f["auc"], f["planted_auc"] - 0.01, f)

    def test_a_job_checkpoints_and_a_second_launch_resumes_it_to_the_uninterrupted_result(self):
        small = ["--ctr-train", "100000", "--ctr-test", "5000", "--batch", "128"]
        with tempfile.TemporaryDirectory() as tmp:
            rc, out = launch(["--num-ps", "2", "--num-workers", "2"], small + ["--steps", "300"])
            self.assertEqual(rc, 0, out[-3000:])
            straight = final(out)
            ckpt = os.path.join(tmp, "ckpt")
            rc, out = launch(["--num-ps", "2", "--num-workers", "2", "--checkpoint-dir", ckpt,
                              "--checkpoint-every", "100"], small + ["--steps", "200"])
            self.assertEqual(rc, 0, out[-3000:])
            self.assertIn("[worker 0] checkpoint of step 100 saved", out)
            self.assertIn("[worker 0] checkpoint of step 200 saved", out)
            self.assertTrue(any(n.startswith("MANIFEST-") for n in os.listdir(ckpt)), os.listdir(ckpt))
            metrics = os.path.join(tmp, "m{rank}.jsonl")
            rc, out = launch(["--num-ps", "2", "--num-workers", "2", "--resume", ckpt],
                             small + ["--steps", "300", "--metrics-out", metrics])
            self.assertEqual(rc, 0, out[-3000:])
            for r in range(2):
                self.assertIn(f"[worker {r}] resuming the job at step 200 of 300", out)
                with open(metrics.replace("{rank}", str(r))) as fh:
                    records = [json.loads(line) for line in fh]
                start = [x for x in records if x["kind"] == "start"][0]
                end = [x for x in records if x["kind"] == "end"][0]
                self.assertEqual((start["start"], end["steps"]), (200, 100), f"worker {r}")
            resumed = final(out)
            self.assertIsNotNone(resumed, out[-3000:])
            # Sync training repeats its bits: the resumed job ends where the uninterrupted one did.
            self.assertEqual((resumed["auc"], resumed["logloss"]), (straight["auc"], straight["logloss"]))

    def test_a_worker_killed_mid_run_is_restarted_and_rejoins_the_job(self):
        # SIGKILL worker 1 once it has reported step 200; the launcher restarts it alone
        # (FERRY_RESUME=1), it joins at the job's step and the job ends.
        cmd = [sys.executable, LAUNCHER, "--bin-dir", BUILD_DIR, "--base-port", "0", "--num-ps", "2",
               "--num-workers", "2", "--", sys.executable, DLRM, "--threads", "1", "--log-every", "100",
               "--steps", "800", "--ctr-train", "200000", "--ctr-test", "5000", "--batch", "128"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=TOP)
        lines, pids, killed = [], {}, None
        timer = threading.Timer(300, p.kill)  # bounded: the launcher is killed after 300 s
        timer.start()
        try:
            for line in p.stdout:
                lines.append(line)
                m = re.match(r"^ferry-launch: started worker (\d+) pid (\d+): ", line)
                if m:
                    pids[int(m.group(1))] = int(m.group(2))
                if killed is None and re.match(r"^\[worker 1\] step 200/800 ", line):
                    killed = pids[1]
                    os.kill(killed, signal.SIGKILL)
            p.wait()
        finally:
            timer.cancel()
        out = "".join(lines)
        self.assertIsNotNone(killed, out[-3000:])
        self.assertEqual(p.returncode, 0, out[-3000:])
        m = re.search(r"^\[worker 1\] resuming the job at step (\d+) of 800$", out, re.M)
        self.assertIsNotNone(m, out[-3000:])
        # Where the job was, not where it began: worker 1 was killed after its 200th backward had
        # handed that step's push to the client's I/O thread, which may not have sent it yet; the
        # job is then at step 199 (the step its partner still waits on) or 200.
        self.assertGreaterEqual(int(m.group(1)), 199)
        f = final(out)
        self.assertIsNotNone(f, out[-3000:])
        self.assertGreater(f["auc"], f["planted_auc"] - 0.05, f)

    def test_the_readme_quickstart_runs(self):
        cmd = [sys.executable, LAUNCHER, "--bin-dir", BUILD_DIR, "--base-port", "0", "--num-ps", "2",
               "--num-workers", "2", "--", sys.executable, os.path.join(TOP, "examples", "quickstart.py")]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240, cwd=TOP)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:])
        losses = {}
        for r in range(2):
            found = re.findall(rf"^\[worker {r}\] step (\d+)/300 loss (\S+)(?: ETA \S+)?$", p.stdout, re.M)
            self.assertEqual([int(s) for s, _ in found], [100, 200, 300], p.stdout[-3000:])
            losses[r] = [float(v) for _, v in found]
            self.assertLess(losses[r][-1], losses[r][0], losses)  # it learns (a sync run repeats its bits)

    def test_criteo_files_stream_through_the_dlrm(self):
        # Criteo-format files (gzipped, one with bad lines), read by each worker's share (by file).
        import gzip
        import random
        rng = random.Random(3)
        with tempfile.TemporaryDirectory() as tmp:
            for day in range(2):
                with gzip.open(os.path.join(tmp, f"day_{day}.gz"), "wt") as fh:
                    for i in range(3000):
                        hot = rng.random() < 0.5
                        cats = [f"{rng.randrange(40) + (1000 if hot and f < 3 else 0):08x}" for f in range(26)]
                        ints = [str(rng.randrange(100)) for _ in range(13)]
                        label = int(rng.random() < (0.7 if hot else 0.1))
                        fh.write("\t".join([str(label)] + ints + cats) + "\n")
                        if day == 1 and i % 1000 == 0:
                            fh.write("not a criteo line\n")
            rc, out = launch(["--num-ps", "2", "--num-workers", "2"],
                             ["--criteo-train", os.path.join(tmp, "day_*.gz"), "--criteo-test",
                              os.path.join(tmp, "day_0.gz"), "--test-limit", "2000", "--steps", "120",
                              "--batch", "64", "--hash-buckets", "2000", "--lr", "0.02", "--dense-lr", "0.01"])
        self.assertEqual(rc, 0, out[-3000:])
        f = final(out)
        self.assertIsNotNone(f, out[-3000:])
        self.assertGreater(f["auc"], 0.8, f)  # the label follows the planted "hot" ids
        # Worker 1 reads day_1 (files are shared by file): its bad lines are counted and named.
        self.assertIn("3 of 3003 line(s) bad", out)
        self.assertIn("day_1.gz:2: 1 tab-separated fields, expected 40", out)

    def test_hybrid_dense_layers_under_ddp_train(self):
        rc, out = launch(["--num-ps", "1", "--num-workers", "2"],
                         ["--mode", "hybrid", "--steps", "300", "--ctr-test", "5000"])
        self.assertEqual(rc, 0, out[-3000:])
        f = final(out)
        self.assertIsNotNone(f, out[-3000:])
        self.assertGreater(f["auc"], f["planted_auc"] - 0.05, f)


if __name__ == "__main__":
    unittest.main()
