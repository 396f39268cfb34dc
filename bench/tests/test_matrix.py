"""Tests of bench/ferry-matrix, the training-matrix harness.

Needs FERRY_BUILD_DIR (the CMake build dir holding bin/ferry-ps and bin/ferry-trainer;
ctest sets it) and gnuplot (Debian's gnuplot-nox, which ./build.sh installs). Run by hand:
    FERRY_BUILD_DIR=build python3 -m unittest -v test_matrix      (from bench/tests/)

- TinyMatrixTest runs the `tiny` preset (a few steps per run) end to end on real local clusters
  and checks that every output file is produced and parseable (~30 s on 2 cores).
- FailureTest uses the real ferry-ps and fake_trainer.py (no training) to check that failed,
  overrun and garbled runs are recorded as such while every output is still written.
- The rest are unit tests of the harness's parsing and arithmetic.
"""

import csv
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
HARNESS = os.path.join(REPO, "bench", "ferry-matrix")
FAKE_TRAINER = os.path.join(HERE, "fake_trainer.py")
BUILD_DIR = os.path.abspath(os.environ.get("FERRY_BUILD_DIR", os.path.join(REPO, "build")))
PS_BIN = os.path.join(BUILD_DIR, "bin", "ferry-ps")
TRAINER_BIN = os.path.join(BUILD_DIR, "bin", "ferry-trainer")
sys.path.insert(0, os.path.join(REPO, "bench"))

from matrix import machine, metrics, presets, report, runner  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _alive(pid):
    """True while pid names a process that is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def require_gnuplot(test):
    if not shutil.which("gnuplot"):
        test.fail("gnuplot is not installed (not on PATH): the harness draws its plots with it. "
                  "Install Debian's gnuplot-nox: apt-get install gnuplot-nox (./build.sh "
                  "installs it).")


def run_harness(args, timeout, env=None):
    r = subprocess.run([sys.executable, HARNESS] + args, capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, **(env or {})))
    return r.returncode, r.stdout + r.stderr


def png_size(path):
    """(width, height) of a PNG file; AssertionError if it is not one."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != PNG_SIGNATURE or head[12:16] != b"IHDR":
        raise AssertionError(f"{path} is not a PNG file")
    return struct.unpack(">II", head[16:24])


class OutputChecks:
    """Checks every output of a finished matrix in self.out; returns the parsed runs.json."""

    def check_outputs(self, expected_runs, output):
        out = self.out
        for name in ("runs.json", "runs.csv", "summary.md"):
            self.assertTrue(os.path.isfile(os.path.join(out, name)), f"{name} missing\n{output}")
        doc = report.load_json(os.path.join(out, "runs.json"))
        self.assertEqual(sorted(r["run_id"] for r in doc["runs"]), sorted(expected_runs))
        for key in ("machine", "config", "started_utc", "finished_utc", "command"):
            self.assertIn(key, doc)

        with open(os.path.join(out, "runs.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
        self.assertEqual(list(rows[0].keys()), report.CSV_COLUMNS)
        self.assertEqual(sorted(r["run_id"] for r in rows), sorted(expected_runs))
        for row in rows:
            if row["status"] == "ok":
                for col in ("final_quality", "examples_per_sec_total", "bytes_pushed",
                            "pull_ms_per_step", "compute_ms_per_step", "push_ms_per_step",
                            "wait_ms_per_step"):
                    float(row[col])  # parseable

        with open(os.path.join(out, "summary.md")) as f:
            md = f.read()
        self.assertIn("| workers | mode |", md)
        for run in doc["runs"]:
            self.assertIn(f"| {run['settings']['mode']} |", md)

        pngs = []
        for model in doc["config"]["models"]:
            for kind in ("quality-vs-time", "quality-vs-steps", "throughput"):
                png = os.path.join(out, "plots", f"{model}-{kind}.png")
                w, h = png_size(png)
                self.assertGreater(w, 300)
                self.assertGreater(h, 200)
                self.assertTrue(os.path.isfile(os.path.join(out, "plots", "src",
                                                            f"{model}-{kind}.gp")))
                self.assertIn(f"(plots/{model}-{kind}.png)", md)
                pngs.append(png)
        self.assertEqual(len(pngs), 3 * len(doc["config"]["models"]))
        return doc


@unittest.skipUnless(os.access(PS_BIN, os.X_OK) and os.access(TRAINER_BIN, os.X_OK),
                     f"ferry-ps / ferry-trainer not built under {BUILD_DIR}")
class TinyMatrixTest(OutputChecks, unittest.TestCase):
    def setUp(self):
        require_gnuplot(self)
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-matrix-test-")
        self.out = os.path.join(self.tmp.name, "tiny")

    def tearDown(self):
        self.tmp.cleanup()

    def test_tiny_matrix_end_to_end(self):
        rc, output = run_harness(["--preset", "tiny", "--bin-dir", BUILD_DIR, "--out", self.out,
                                  "--straggler", "x2"], timeout=150)
        self.assertEqual(rc, 0, output)
        p = presets.PRESETS["tiny"]
        runs, _ = presets.build_runs(list(p.models.values()), p.workers,
                                     presets.expand_modes(p.modes, p.ssp), p.num_ps, 1, "x2")
        doc = self.check_outputs([r.run_id for r in runs], output)
        for run in doc["runs"]:
            self.assertEqual(run["status"], "ok", run.get("summary"))
            res, s = run["result"], run["settings"]
            self.assertEqual(res["checks"], [])
            self.assertEqual(res["steps"], p.models[s["model"]].steps)
            self.assertEqual(len(res["steps_per_worker"]), s["workers"])
            self.assertGreater(res["throughput"]["total"], 0)
            self.assertGreater(res["bytes"]["sent"], 0)
            self.assertGreater(res["bytes"]["received"], 0)
            # Evaluated during the run and at the end. With a backup worker rank 0 may fall behind
            # and learn at one pull that the job passed the mid-run mark and ended (6 steps
            # here): then the final evaluation is its only one.
            self.assertGreaterEqual(len(res["curve"]), 1 if s["backup_workers"] > 0 else 2, (s, res["curve"]))
            self.assertEqual(s["straggler"], f"{s['workers'] - 1}:x2" if s["workers"] > 1 else None)
            if s["consistency"] == "sync" and not s["embeddings"]:
                self.assertIsNone(res["staleness"])
            else:
                self.assertGreater(res["staleness"]["updates"], 0)


@unittest.skipUnless(os.access(PS_BIN, os.X_OK), f"ferry-ps not built under {BUILD_DIR}")
class FailureTest(OutputChecks, unittest.TestCase):
    def setUp(self):
        require_gnuplot(self)
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-matrix-test-")
        self.out = os.path.join(self.tmp.name, "out")
        self.bin = os.path.join(self.tmp.name, "bin")
        os.makedirs(self.bin)
        os.symlink(PS_BIN, os.path.join(self.bin, "ferry-ps"))
        os.symlink(FAKE_TRAINER, os.path.join(self.bin, "ferry-trainer"))

    def tearDown(self):
        self.tmp.cleanup()

    def test_failed_overrun_and_garbled_runs_are_recorded(self):
        # Runs that end get a deadline no loaded machine reaches (each takes a few seconds);
        # the run that hangs gets a short one in a matrix of its own: it overruns any deadline.
        rc, output = run_harness(
            ["--preset", "tiny", "--models", "mlp", "--workers", "2",
             "--modes", "sync,async,ssp:3", "--bin-dir", self.bin, "--out", self.out,
             "--run-timeout", "60"],
            timeout=240, env={"FERRY_FAKE_FAIL": "async", "FERRY_FAKE_BADJSON": "ssp:3"})
        self.assertEqual(rc, 1, output)  # some runs failed; every output is still written
        ids = ["mlp-w2-sync", "mlp-w2-async", "mlp-w2-ssp3"]
        doc = self.check_outputs(ids, output)
        by_id = {r["run_id"]: r for r in doc["runs"]}
        self.assertEqual(by_id["mlp-w2-sync"]["status"], "ok")

        failed = by_id["mlp-w2-async"]
        self.assertEqual(failed["status"], "failed")
        self.assertIsNone(failed["result"])
        text = "\n".join(failed["summary"])
        self.assertRegex(text, r"FAILED: worker 1 \(pid \d+\) failed: exit status 3")
        self.assertIn("failing on purpose", text)

        garbled = by_id["mlp-w2-ssp3"]
        self.assertEqual(garbled["status"], "failed")
        self.assertIn("metrics-0.jsonl:2: not JSON", garbled["summary"][0])

        with open(os.path.join(self.out, "summary.md")) as f:
            md = f.read()
        self.assertIn("### `mlp-w2-async`: failed", md)
        with open(os.path.join(self.out, "runs.csv"), newline="") as f:
            rows = {r["run_id"]: r for r in csv.DictReader(f)}
        self.assertIn("exit status 3", rows["mlp-w2-async"]["error"])

        # --report-only redoes the CSV, the summary and the plots from runs.json alone.
        for name in ("runs.csv", "summary.md"):
            os.remove(os.path.join(self.out, name))
        shutil.rmtree(os.path.join(self.out, "plots"))
        rc, output = run_harness(["--report-only", self.out], timeout=60)
        self.assertEqual(rc, 0, output)
        self.check_outputs(ids, output)

        hung_out = os.path.join(self.tmp.name, "hung")
        rc, hung_output = run_harness(
            ["--preset", "tiny", "--models", "mlp", "--workers", "2", "--modes", "ssp:1",
             "--bin-dir", self.bin, "--out", hung_out, "--run-timeout", "3"],
            timeout=120, env={"FERRY_FAKE_HANG": "ssp:1"})
        self.assertEqual(rc, 1, hung_output)
        hung = report.load_json(os.path.join(hung_out, "runs.json"))["runs"][0]
        self.assertEqual(hung["run_id"], "mlp-w2-ssp1")
        self.assertEqual(hung["status"], "timeout")
        self.assertIn("no result after 3 s", hung["summary"][0])
        with open(os.path.join(hung_out, "summary.md")) as f:
            self.assertIn("### `mlp-w2-ssp1`: timeout", f.read())

    def test_killed_harness_leaves_no_process(self):
        """SIGTERM to ferry-matrix stops the running cluster and exits 130; after a SIGKILL, which
        it cannot handle, the launcher still stops the cluster (it dies with the harness)."""
        for sig, want_rc in ((signal.SIGTERM, 130), (signal.SIGKILL, -signal.SIGKILL)):
            with self.subTest(signal=sig.name):
                out = os.path.join(self.tmp.name, sig.name)
                proc = subprocess.Popen(
                    [sys.executable, HARNESS, "--preset", "tiny", "--models", "mlp", "--workers", "2",
                     "--modes", "async", "--bin-dir", self.bin, "--out", out, "--run-timeout", "120"],
                    env=dict(os.environ, FERRY_FAKE_HANG="async"), stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, text=True)
                log = os.path.join(out, "runs", "mlp-w2-async", "launcher.log")
                pids = self._wait_for_started(proc, log, 4)  # 2 ps + 2 hanging workers
                proc.send_signal(sig)
                output, _ = proc.communicate(timeout=60)
                self.assertEqual(proc.returncode, want_rc, output)
                deadline = time.monotonic() + 20
                while any(_alive(p) for p in pids) and time.monotonic() < deadline:
                    time.sleep(0.1)
                self.assertEqual([p for p in pids if _alive(p)], [], output)

    def _wait_for_started(self, proc, log, count):
        """The pids of the first `count` processes the launcher says it started."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            text = open(log).read() if os.path.exists(log) else ""
            pids = [int(p) for p in re.findall(r"^ferry-launch: started \w+ \d+ pid (\d+):", text,
                                               re.M)]
            if len(pids) >= count:
                return pids
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        proc.kill()
        self.fail(f"the launcher did not start {count} processes: {proc.communicate()[0]}")

    def test_old_trainer_is_refused_before_running(self):
        old = os.path.join(self.tmp.name, "old")
        os.makedirs(old)
        os.symlink(PS_BIN, os.path.join(old, "ferry-ps"))
        with open(os.path.join(old, "ferry-trainer"), "w") as f:
            f.write("#!/bin/sh\necho 'usage: ferry-trainer --metrics-out FILE'\n")
        os.chmod(os.path.join(old, "ferry-trainer"), 0o755)
        rc, output = run_harness(["--preset", "tiny", "--bin-dir", old, "--out", self.out],
                                 timeout=30)
        self.assertEqual(rc, 2, output)
        self.assertIn("lacks --backup-workers, --straggler", output)
        self.assertFalse(os.path.exists(os.path.join(self.out, "runs.json")))

    def test_missing_gnuplot_is_named(self):
        path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                               if not os.path.exists(os.path.join(d, "gnuplot")))
        # Dropping gnuplot's folder (/usr/bin) drops python3 with it, which the fake trainer's
        # "#!/usr/bin/env python3" needs: put this interpreter back, alone.
        py_dir = os.path.join(self.tmp.name, "python")
        os.makedirs(py_dir)
        os.symlink(sys.executable, os.path.join(py_dir, "python3"))
        path = py_dir + os.pathsep + path
        rc, output = run_harness(["--preset", "tiny", "--bin-dir", self.bin, "--out", self.out],
                                 timeout=30, env={"PATH": path})
        self.assertEqual(rc, 2, output)
        self.assertIn("gnuplot not found", output)
        self.assertIn("gnuplot-nox", output)


class DeadlineTest(unittest.TestCase):
    """How a run's end is recorded against its deadline, with a fake ferry-launch."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-matrix-test-")

    def tearDown(self):
        self.tmp.cleanup()

    def test_a_run_that_failed_by_its_deadline_is_failed_however_long_its_stop_takes(self):
        """A worker failed and the launcher is stopping the cluster when the deadline passes (on
        a loaded machine that stop can take seconds): the run failed, it did not overrun. Seen
        with two busy loops on 2 cores: such a run was recorded as 'timeout'."""
        deadline_s = 5.0  # the fake launcher says it is stopping at its start: well within it
        launcher = os.path.join(self.tmp.name, "fake-launch")
        with open(launcher, "w") as f:
            f.write("import sys, time\n"
                    "print('ferry-launch: started worker 1 pid 4242: ferry-trainer', flush=True)\n"
                    "print('ferry-launch: stopping ps 0, ps 1, worker 0 (worker 1 failed)', flush=True)\n"
                    # Its stop ends past the harness's deadline, which began before this process.
                    f"time.sleep({deadline_s} + 1)\n"
                    "print('ferry-launch: FAILED: worker 1 (pid 4242) failed: exit status 3', flush=True)\n"
                    "sys.exit(1)\n")
        spec = presets.RunSpec(presets.PRESETS["tiny"].models["mlp"], 2, presets.parse_mode("async"), 2, 1)
        rec = runner.run_one(spec, launcher, self.tmp.name, os.path.join(self.tmp.name, "run"), deadline_s)
        self.assertEqual(rec["status"], "failed", rec)
        self.assertEqual(rec["launcher_rc"], 1, rec)
        self.assertGreater(rec["duration_s"], deadline_s, rec)  # the stop did outlast the deadline
        self.assertIn("ferry-launch: FAILED: worker 1 (pid 4242) failed: exit status 3", rec["summary"])


class UnitTest(unittest.TestCase):
    def test_job_ended(self):
        """A run whose launcher is stopping its cluster has ended (finished or failed): at the
        deadline it is given its stop, not called overrun."""
        self.assertTrue(runner.job_ended("ferry-launch: started worker 0 pid 1: x\n"
                                         "ferry-launch: stopping ps 0, worker 1 (worker 0 failed)\n"))
        self.assertTrue(runner.job_ended("ferry-launch: stopping ps 0 (all workers finished)\n"))
        self.assertFalse(runner.job_ended("ferry-launch: started worker 0 pid 1: x\n"
                                          "[worker 0] ferry-launch: stopping soon\n"))
        self.assertFalse(runner.job_ended(""))

    def test_modes(self):
        self.assertEqual(presets.parse_mode("sync+backup1"), presets.Mode("sync+backup1", "sync", 1))
        self.assertEqual(presets.parse_mode("ssp:2").consistency, "ssp:2")
        self.assertEqual(presets.parse_mode("ssp:2").slug, "ssp2")
        for bad in ("ssp", "sync+backup0", "bsp", "ssp:-1"):
            with self.assertRaises(ValueError):
                presets.parse_mode(bad)
        modes = presets.expand_modes(presets.ALL_MODES, 2)  # ssp:{ssp} = ssp:2 is dropped
        self.assertEqual([m.name for m in modes], ["sync", "sync+backup1", "async", "ssp:2", "hybrid"])
        hybrid = presets.parse_mode("hybrid")
        self.assertEqual((hybrid.consistency, hybrid.embeddings), ("sync", "async"))

    def test_straggler_and_skips(self):
        self.assertEqual(presets.parse_straggler("50ms"), "50ms")
        self.assertEqual(presets.parse_straggler("x1.5"), "x1.5")
        for bad in ("50", "2x", "x0.5", "fast"):
            with self.assertRaises(ValueError):
                presets.parse_straggler(bad)
        m = presets.PRESETS["tiny"].models["mlp"]
        runs, skipped = presets.build_runs([m], [1, 4], presets.expand_modes(
            ["sync", "sync+backup1"], 2), 2, 7, "x2")
        self.assertEqual([r.run_id for r in runs], ["mlp-w1-sync", "mlp-w4-sync",
                                                    "mlp-w4-sync-backup1"])
        self.assertEqual(skipped, [("mlp", 1, "sync+backup1", "needs more than 1 worker(s)")])
        # hybrid: the ctr model's embeddings async over sync; the mlp has none to set
        ctr = presets.PRESETS["tiny"].models["ctr"]
        runs2, skipped2 = presets.build_runs([m, ctr], [2], [presets.parse_mode("hybrid")], 2, 7)
        self.assertEqual([r.run_id for r in runs2], ["ctr-w2-hybrid"])
        self.assertEqual(skipped2, [("mlp", 2, "hybrid", "the model has no embedding tables")])
        args2 = runs2[0].trainer_args("m-{rank}.jsonl")
        self.assertEqual(args2[args2.index("--consistency") + 1], "sync")
        self.assertEqual(args2[args2.index("--table") + 1], "ctr/emb*:consistency=async")
        self.assertIsNone(runs[0].straggler)
        args = runs[2].trainer_args("m-{rank}.jsonl")
        for a, b in (("--straggler", "3:x2"), ("--backup-workers", "1"), ("--seed", "7"),
                     ("--metrics-out", "m-{rank}.jsonl"), ("--consistency", "sync")):
            self.assertEqual(args[args.index(a) + 1], b)

    def test_harness_owned_trainer_flags_are_refused(self):
        presets.check_extra_args(["--device", "cpu", "--ctr-zipf=1.2"])
        for arg in ("--batch", "--accumulate=4", "--metrics-out"):
            with self.assertRaisesRegex(ValueError, "the harness sets " + arg.split("=")[0]):
                presets.check_extra_args(["--device", "cpu", arg])
        rc, output = run_harness(["--preset", "tiny", "--dry-run", "--trainer-arg=--batch",
                                  "--trainer-arg=8"], timeout=30)
        self.assertEqual(rc, 2, output)
        self.assertIn("--trainer-arg --batch: the harness sets --batch itself", output)

    def test_per_run_files_are_not_tracked(self):
        """Each run's metrics and logs are output, not source: git ignores them; the summaries
        and runs.json beside them are tracked."""
        repo = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
        if not os.path.exists(os.path.join(repo, ".git")):
            self.skipTest("not a git checkout")

        def ignored(path):
            return subprocess.run(["git", "-C", repo, "check-ignore", "-q", "--no-index", path]).returncode == 0

        self.assertTrue(ignored("bench/results/small/runs/mlp-w2-sync/metrics-0.jsonl"))
        self.assertTrue(ignored("bench/results/new-preset/runs/x/launcher.log"))
        for kept in ("summary.md", "runs.json", "runs.csv", "plots/mlp-throughput.png"):
            self.assertFalse(ignored(f"bench/results/small/{kept}"), kept)

    def test_results_are_not_uncommitted_code(self):
        """The matrix regenerates its tracked results: they do not mark the code as modified."""
        with tempfile.TemporaryDirectory() as d:
            def git(*args):
                subprocess.run(["git", "-C", d, "-c", "user.name=t", "-c", "user.email=t@t"] +
                               list(args), check=True, capture_output=True)

            def write(path, text):
                os.makedirs(os.path.dirname(os.path.join(d, path)), exist_ok=True)
                with open(os.path.join(d, path), "w") as f:
                    f.write(text)

            files = ("code.py", "bench/results/small/runs.json")
            for f in files:
                write(f, "1\n")
            git("init", "-q")
            git("add", ".")
            git("commit", "-qm", "first")
            write(files[1], "2\n")
            out = os.path.join(d, "bench", "results", "small")
            m = machine.describe(d, os.path.join(d, "code.py"), out)
            self.assertEqual((m["git_dirty"], m["git_modified"]), (False, []))
            write(files[0], "2\n")
            m = machine.describe(d, os.path.join(d, "code.py"), out)
            self.assertEqual((m["git_dirty"], m["git_modified"]), (True, ["code.py"]))

    def test_summarize(self):
        m = presets.PRESETS["tiny"].models["ctr"]
        m.target = 0.7
        spec = presets.RunSpec(m, 2, presets.parse_mode("async"), 2, 1)
        t = lambda ev: {"pull_s": 1.0, "compute_s": 2.0, "push_s": 0.5, "wait_s": 0.1,
                        "eval_s": ev}
        with tempfile.TemporaryDirectory() as d:
            lines = {0: [{"event": "start", "rank": 0, "num_workers": 2, "model": "ctr",
                          "consistency": "async", "backup_workers": 0, "wall_s": 0,
                          "planted_auc": 0.82},
                         {"event": "eval", "rank": 0, "step": 5, "wall_s": 3.0, "auc": 0.65,
                          "log_loss": 0.5, "time": t(0.5)},
                         {"event": "eval", "rank": 0, "step": 7, "wall_s": 4.0, "auc": None,
                          "log_loss": 0.5, "time": t(0.7)},
                         {"event": "eval", "rank": 0, "step": 10, "wall_s": 6.0, "auc": 0.72,
                          "log_loss": 0.45, "time": t(1.0), "merged": True},
                         {"event": "end", "rank": 0, "steps": 10, "wall_s": 6.5, "examples": 1000,
                          "examples_per_sec": 153.8, "time": t(1.5), "bytes_sent": 100,
                          "bytes_received": 200, "staleness": {"0": 6, "2": 2},
                          "final": {"step": 10, "auc": 0.73, "log_loss": 0.44, "count": 50}}],
                     1: [{"event": "start", "rank": 1, "wall_s": 0},
                         {"event": "end", "rank": 1, "steps": 20, "wall_s": 4.0, "examples": 2000,
                          "examples_per_sec": 500.0, "train_s": 2.5, "final_wait_s": 1.5,
                          "time": dict(t(0.0), wait_s=1.6), "bytes_sent": 10,
                          "bytes_received": 20}]}
            for r, evs in lines.items():
                with open(os.path.join(d, f"metrics-{r}.jsonl"), "w") as f:
                    f.write("".join(json.dumps(e) + "\n" for e in evs))
            res = metrics.summarize(spec, d)
        self.assertEqual(res["target"], {"metric": "auc", "value": 0.7, "reached": True,
                                         "train_s": 5.0, "wall_s": 6.0, "step": 10})
        self.assertEqual(res["final"]["quality"], 0.73)  # end.final beats the last eval event
        self.assertEqual([p["step"] for p in res["curve"]], [5, 10])
        self.assertEqual(res["curve"][0]["loss"], 0.5)
        # examples / (wall - eval) without train_s; examples / train_s with it (the closing wait
        # for the other workers is not training time)
        self.assertEqual(res["throughput"]["per_worker"], [200.0, 800.0])
        self.assertEqual(res["throughput"]["total"], 1000.0)
        self.assertEqual(res["checks"], ["eval #2 (step 7) has no auc; left out"])
        self.assertTrue(res["final"]["merged"])  # from the eval line end.final repeats
        # Each worker's end event, as it was (the metrics files are not kept), and how far the
        # time split is from wall_s: rank 0 5.1 s of 6.5, rank 1 5.1 s of 4.0.
        self.assertEqual(res["workers"], [{"steps": 10, "wall_s": 6.5},
                                          {"steps": 20, "wall_s": 4.0, "train_s": 2.5,
                                           "final_wait_s": 1.5}])
        self.assertEqual(res["time_split"]["events"], 2)
        self.assertAlmostEqual(res["time_split"]["max_abs_s"], 1.4)
        self.assertAlmostEqual(res["time_split"]["max_rel"], 1.1 / 4.0)
        self.assertEqual(res["bytes"], {"sent": 110, "received": 220})
        self.assertEqual(res["staleness"], {"hist": {0: 6, 2: 2}, "updates": 8, "mean": 0.5,
                                            "max": 2, "capped": 0})
        # Sync with backup workers: the budget is the job's (global steps); a worker that fell
        # behind ran fewer. The job's steps come from the start event, each worker's from its end.
        with tempfile.TemporaryDirectory() as d:
            lines[0][0]["steps"] = 12
            del lines[0][-1]["final"]["step"]  # as the trainer writes it
            for r, evs in lines.items():
                with open(os.path.join(d, f"metrics-{r}.jsonl"), "w") as f:
                    f.write("".join(json.dumps(e) + "\n" for e in evs))
            job = metrics.summarize(spec, d)
        self.assertEqual((job["steps"], job["steps_per_worker"]), (12, [10, 20]))
        self.assertEqual(job["final"]["step"], 12)  # the final evaluation is at the job's end
        capped = metrics.staleness_stats({"0": 3, "64": 1})
        self.assertEqual((capped["max"], capped["capped"], capped["mean"]), (64, 1, 16.0))
        self.assertEqual(report.hist_text(capped), "0:3 64+:1")
        self.assertAlmostEqual(res["step_ms"]["pull"], (100.0 + 50.0) / 2)  # 1 s / 10, 1 s / 20
        # wait_s includes the closing wait (final_wait_s), which per-step figures leave out:
        # rank 0 0.1 s / 10 steps, rank 1 (1.6 - 1.5) s / 20 steps
        self.assertAlmostEqual(res["step_ms"]["wait"], (10.0 + 5.0) / 2)
        self.assertEqual(res["planted"], {"planted_auc": 0.82})


if __name__ == "__main__":
    unittest.main()
