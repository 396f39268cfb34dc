"""Tests of launch/ferry-launch and its package launch/ferry_launch: the local, ssh and Slurm
backends.

Needs FERRY_BUILD_DIR (the CMake build dir holding bin/ferry-ps and bin/ferry-trainer);
ctest sets it. Run by hand:  FERRY_BUILD_DIR=build python3 -m unittest -v test_launch
(from launch/tests/). Ports on this machine are chosen free by the test (or --base-port 0).

Stand-ins written by the tests: a stub trainer (records its pid, fails or ignores SIGTERM on
demand), an "ssh" that runs the command on this machine or inside a network namespace, and an
"srun" that runs a step's tasks here. NetnsTest needs root (ip netns) and skips without it.
"""

import collections
import contextlib
import io
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import random
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
import unittest.mock
import zlib

from build_paths import BUILD_DIR, HERE, KEYS_BIN, LAUNCHER, PS_BIN, TRAINER_BIN

SHORT_TRAINING = ["--model", "mlp", "--hidden", "16", "--steps", "20", "--batch", "32",
                  "--train-limit", "2000", "--test-limit", "500", "--quiet"]

# A stand-in for ferry-trainer: records its pid, then the rank named by FERRY_STUB_FAIL_RANK
# (or the trainer flag --stub-fail-rank R) exits 3; the others sleep, ignoring SIGTERM when
# FERRY_STUB_IGNORE_TERM=1 (or --stub-ignore-term), to force SIGKILL.
STUB_TRAINER = textwrap.dedent(f"""\
    #!{sys.executable}
    import os, signal, sys, time
    argv = sys.argv[1:]
    rank = argv[argv.index("--rank") + 1]
    fail = os.environ.get("FERRY_STUB_FAIL_RANK")
    if "--stub-fail-rank" in argv:
        fail = argv[argv.index("--stub-fail-rank") + 1]
    ignore = os.environ.get("FERRY_STUB_IGNORE_TERM") == "1" or "--stub-ignore-term" in argv
    print(f"stub trainer rank {{rank}} pid {{os.getpid()}} args {{argv}}", flush=True)
    if rank == fail:
        time.sleep(0.5)
        print("stub: failing on purpose", flush=True)
        sys.exit(3)
    if ignore:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(120)
    """)


def free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def launcher_env(extra=None):
    """The test's environment without any Slurm job or GPU selection it may run in, plus
    extra."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SRUN_")) and k != "CUDA_VISIBLE_DEVICES"}
    env.update(extra or {})
    return env


def write_script(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


def make_stub_bin_dir(parent):
    """A flat bin dir: the real ferry-ps and the stub trainer."""
    d = os.path.join(parent, "bin")
    os.makedirs(d)
    os.symlink(PS_BIN, os.path.join(d, "ferry-ps"))
    write_script(os.path.join(d, "ferry-trainer"), STUB_TRAINER)
    return d


def wait_until_gone(pids, timeout=5.0):
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def pid_alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class Run:
    """A running launcher whose stdout+stderr are collected line by line."""

    def __init__(self, args, env=None):
        self.lines = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen([sys.executable, LAUNCHER] + args, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=launcher_env(env))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def wait_for(self, pattern, timeout=30):
        rx = re.compile(pattern)
        with self.cond:
            ok = self.cond.wait_for(lambda: any(rx.search(l) for l in self.lines), timeout)
        if not ok:
            raise AssertionError(f"no line matching {pattern!r}; got:\n{self.output}")

    def finish(self, timeout=60):
        rc = self.proc.wait(timeout)
        self.reader.join(5)
        self.proc.stdout.close()
        return rc

    def kill_if_running(self):
        """Kills the launcher if it still runs (a test that failed before the job's end)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.finish(timeout=30)

    @property
    def output(self):
        with self.cond:
            return "\n".join(self.lines)

    def pids(self):
        return parse_pids(self.output)


def read_npy(path):
    """The values of a little-endian int64 or float32 .npy file (ferry-ckpt dump's), flat."""
    with open(path, "rb") as f:
        raw = f.read()
    assert raw[:6] == b"\x93NUMPY", path
    header_len = int.from_bytes(raw[8:10], "little") if raw[6] == 1 else int.from_bytes(raw[8:12], "little")
    start = (10 if raw[6] == 1 else 12) + header_len
    header = raw[start - header_len:start].decode("latin1")
    code = {"'<i8'": "q", "'<f4'": "f"}[re.search(r"'descr': ('[^']+')", header).group(1)]
    return list(struct.unpack("<%d%s" % ((len(raw) - start) // struct.calcsize(code), code), raw[start:]))


def parse_pids(output):
    """{"ps 0": pid, ...} from the launcher's "started ps 0 pid N" lines."""
    return {m.group(1): int(m.group(2)) for m in
            re.finditer(r"started (\w+ \d+) pid (\d+)", output)}


def load_launcher_module():
    """The launcher's package, ferry_launch (beside launch/ferry-launch), for its functions."""
    launch_dir = os.path.dirname(LAUNCHER)
    if launch_dir not in sys.path:
        sys.path.insert(0, launch_dir)
    dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ in launch/
    try:
        import ferry_launch
    finally:
        sys.dont_write_bytecode = dont_write
    return ferry_launch


_LAUNCHER_MODULE = []


def run_in_process(args, env=None):
    """The launcher's main(args) in this process, for checks that start nothing (usage errors,
    --dry-run): cheaper than a Python start-up each. Returns (exit status, stdout + stderr)."""
    rc, out, _ = run_in_process_split(args, env, merged=True)
    return rc, out


def run_in_process_split(args, env=None, merged=False):
    """run_in_process(), with stdout and stderr apart (or both in the first, merged):
    (exit status, stdout, stderr)."""
    if not _LAUNCHER_MODULE:
        _LAUNCHER_MODULE.append(load_launcher_module())
    out = io.StringIO()
    err = out if merged else io.StringIO()
    with unittest.mock.patch.dict(os.environ, launcher_env(env), clear=True), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = _LAUNCHER_MODULE[0].main(list(args))
        except SystemExit as e:  # argparse
            rc = e.code
    return rc, out.getvalue(), "" if merged else err.getvalue()


def run_launcher(args, timeout=60, env=None):
    r = Run(args, env)
    rc = r.finish(timeout)
    return rc, r.output


@unittest.skipUnless(os.access(PS_BIN, os.X_OK) and os.access(TRAINER_BIN, os.X_OK),
                     f"ferry-ps / ferry-trainer not built under {BUILD_DIR}")
class LaunchTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-launch-test-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def stub_bin_dir(self):
        return make_stub_bin_dir(self.dir)

    def assert_all_gone(self, pids):
        self.assertTrue(pids)
        alive = [f"{who} pid {pid}" for who, pid in pids.items() if pid_alive(pid)]
        self.assertEqual(alive, [], "processes survived the launcher")

    def test_local_cluster_trains_and_exits_zero(self):
        logs = os.path.join(self.dir, "logs")
        rc, out = run_launcher(["--num-ps", "2", "--num-workers", "2", "--base-port", "0",
                                "--ps-arg", "--max-wait-s 30", "--bin-dir", BUILD_DIR,
                                "--log-dir", logs, "--"] + SHORT_TRAINING)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"started ps 1 pid \d+: .* --compute-threads 1 --metrics 127.0.0.1:0 --num-workers 2 --max-wait-s 30\n")
        self.assertIn("[ps 1] ferry-ps rank 1 of 2 listening", out)
        # Where each server's metrics are (a free port on its own address).
        self.assertRegex(out, r"\[ps 1\] ferry-ps rank 1: metrics at http://127\.0\.0\.1:\d+/metrics\n")
        self.assertRegex(out, r"\[worker 1\] ferry-trainer rank 1: metrics at http://127\.0\.0\.1:\d+/metrics\n")
        self.assertRegex(out, r"\[worker 0\] done: 20 steps")
        self.assertIn("[worker 1]", out)
        self.assertEqual(sorted(os.listdir(logs)),
                         ["ps-0.log", "ps-1.log", "worker-0.log", "worker-1.log"])
        with open(os.path.join(logs, "worker-0.log")) as f:
            self.assertIn("done: 20 steps", f.read())
        self.assert_all_gone(parse_pids(out))

    def test_progress_job_shows_one_line_for_the_job(self):
        logs = os.path.join(self.dir, "logs")
        rc, out = run_launcher(["--num-ps", "1", "--num-workers", "2", "--base-port", "0",
                                "--progress", "job", "--bin-dir", BUILD_DIR, "--log-dir", logs, "--",
                                "--model", "ctr", "--ctr-train", "4000", "--ctr-test", "500",
                                "--steps", "40", "--log-every", "10", "--batch", "32"], timeout=120)
        self.assertEqual(rc, 0, out)
        self.assertNotRegex(out, r"(?m)^\[worker \d\] step \d+/40 ")  # folded into the job's line
        job = re.findall(r"(?m)^\[job\] step (\d+)/40 \(workers at [\d-]+\): (\d+) examples/s in all, "
                         r"mean loss [\d.]+(?:, ETA \S+)?$", out)
        self.assertEqual([int(s) for s, _ in job], [10, 20, 30, 40], out[-3000:])
        self.assertRegex(out, r"(?m)^\[job\] step 20/40 .*, ETA \d+s$")
        for r in range(2):  # the logs keep every worker's lines, with the ETA
            with open(os.path.join(logs, f"worker-{r}.log")) as f:
                self.assertRegex(f.read(), r"step 40/40 epoch 1/1: loss .* examples/s .* ETA 0s")

    def test_spec_file_tf_config_style(self):
        ports = free_ports(2)
        spec = os.path.join(self.dir, "spec.json")
        with open(spec, "w") as f:
            json.dump({"cluster": {"ps": [f"127.0.0.1:{ports[0]}", f"localhost:{ports[1]}"],
                                   "worker": ["localhost"]},
                       "task": {"type": "worker", "index": 0}}, f)
        rc, out = run_launcher(["--spec", spec, "--bin-dir", BUILD_DIR,
                                "--log-dir", os.path.join(self.dir, "logs"), "--"]
                               + SHORT_TRAINING)
        self.assertEqual(rc, 0, out)
        self.assertIn(f"--servers tcp://127.0.0.1:{ports[0]},tcp://localhost:{ports[1]}", out)
        self.assertIn(f"--bind tcp://127.0.0.1:{ports[1]}", out)

    def test_failing_worker_stops_everything(self):
        # --max-restarts 0: no restarts (RecoveryTest covers them).
        bin_dir = self.stub_bin_dir()
        r = Run(["--num-ps", "2", "--num-workers", "2", "--base-port", "0", "--grace", "1",
                 "--max-restarts", "0",
                 "--bin-dir", bin_dir, "--log-dir", os.path.join(self.dir, "logs")],
                env={"FERRY_STUB_FAIL_RANK": "1", "FERRY_STUB_IGNORE_TERM": "1"})
        rc = r.finish(30)
        out = r.output
        self.assertNotEqual(rc, 0, out)
        self.assertRegex(out, r"FAILED: worker 1 \(pid \d+\) failed: exit status 3")
        self.assertIn("stub: failing on purpose", out.split("FAILED:")[1])
        self.assertIn("sending SIGKILL", out)  # worker 0 ignored SIGTERM
        pids = r.pids()
        self.assertEqual(sorted(pids), ["ps 0", "ps 1", "worker 0", "worker 1"])
        self.assert_all_gone(pids)

    def test_bad_trainer_flag_fails_naming_worker(self):
        rc, out = run_launcher(["--num-ps", "1", "--num-workers", "2", "--base-port", "0",
                                "--bin-dir", BUILD_DIR, "--log-dir",
                                os.path.join(self.dir, "logs"), "--", "--no-such-flag", "1"])
        self.assertNotEqual(rc, 0, out)
        self.assertRegex(out, r"FAILED: worker \d \(pid \d+\) failed: exit status 2")
        # The summary gives the trainer's own error, not the usage text printed after it (which
        # alone filled the last lines shown before).
        summary = out.split("FAILED:")[1]
        self.assertIn("that say why (usage text left out):", summary)
        self.assertIn("    ferry-trainer: unknown flag --no-such-flag", summary)
        self.assertNotIn("usage: ferry-trainer", summary)
        self.assertNotIn("--criteo-train FILE", summary)

    def test_trainer_says_what_it_waits_for(self):
        # No server at the address: the handshake's wait is reported every 5 s until
        # --connect-timeout-s ends it (exit 1: the servers may come up on a restart).
        p = subprocess.run([TRAINER_BIN, "--servers", f"ipc://{self.dir}/no-server", "--rank", "0",
                            "--num-workers", "1", "--connect-timeout-s", "6", "--model", "ctr",
                            "--ctr-train", "100", "--ctr-test", "10"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertRegex(p.stderr, r"ferry-trainer: worker 0 waiting \d s \(of 6\) for server 0 "
                                   r"\(ipc://.*/no-server\) to answer Hello \(is it running")
        self.assertIn("ferry-trainer: connect: DEADLINE_EXCEEDED: handshake: Hello got no reply", p.stderr)

    def test_refused_settings_exit_2_once_and_say_why(self):
        # A refusal of the user's settings is not a crash: the worker exits 2 on its first try,
        # the launcher does not restart it (restarts are allowed here) and shows the reason.
        # All but the last are refused before the data is loaded (no "data: synthetic" line).
        ctr = ["--model", "ctr", "--ctr-train", "2000", "--ctr-test", "500", "--steps", "5"]
        cases = [
            (["--table", "nosuch/*:lr=0.1"], "'nosuch/*' matches none of the model's tables (ctr/w0,", False),
            (["--consistency", "sync", "--pipeline", "prefetch"],
             "table 'ctr/w0' is sync, and --pipeline prefetch reads parameters a step early", False),
            (["--table", "ctr/*:optimiser=ftrl"], "unknown key 'optimiser' (did you mean optimizer?)", False),
            (["--lerning-rate", "0.1"], "unknown flag --lerning-rate", False),
            # Refused by the servers at the declaration, after the data is loaded.
            (["--table", "ctr/*:consistency=sync,replicas_to_aggregate=3"], "replicas_to_aggregate 3 exceeds the job's 2 workers",
             True),
        ]
        for i, (args, message, loaded) in enumerate(cases):
            with self.subTest(args=args):
                rc, out = run_launcher(["--num-ps", "1", "--num-workers", "2", "--base-port", "0",
                                        "--max-restarts", "3", "--bin-dir", BUILD_DIR, "--log-dir",
                                        os.path.join(self.dir, f"logs-{i}"), "--"] + ctr + args, timeout=120)
                self.assertNotEqual(rc, 0, out)
                self.assertRegex(out, r"FAILED: worker \d \(pid \d+\) failed: exit status 2")
                self.assertIn("is not restarted: exit status 2", out)
                self.assertNotIn("restarting it", out)
                self.assertIn(message, out.split("FAILED:")[1])
                self.assertEqual(bool(re.search(r"^\[worker \d\] data: synthetic", out, re.M)), loaded,
                                 out[-3000:])
                self.assertNotRegex(out, r"restarted worker \d+ pid")

    def test_failure_summary_shows_the_error_lines_and_the_signal(self):
        # A worker that logs progress, an error, then a usage text longer than the summary's
        # line budget, and exits 2; a second variant dies of SIGABRT after its error.
        bin_dir = os.path.join(self.dir, "bin")
        os.makedirs(bin_dir)
        os.symlink(PS_BIN, os.path.join(bin_dir, "ferry-ps"))
        write_script(os.path.join(bin_dir, "ferry-trainer"), textwrap.dedent(f"""\
            #!{sys.executable}
            import os, signal, sys
            argv = sys.argv[1:]
            for i in range(30):
                print(f"step {{i}} loss 0.5", flush=True)
            print("ferry-trainer: training: UNAVAILABLE: server 1 (tcp://h:1) stopped answering",
                  file=sys.stderr, flush=True)
            if "--stub-abort" in argv:
                os.kill(os.getpid(), signal.SIGABRT)
            print("usage: ferry-trainer [flags]", file=sys.stderr)
            for i in range(40):
                print(f"  --flag-{{i}} N   what flag {{i}} does", file=sys.stderr)
            sys.exit(2)
            """))
        for extra, status in (([], "exit status 2"), (["--stub-abort"], "killed by SIGABRT")):
            rc, out = run_launcher(["--num-ps", "1", "--num-workers", "1", "--base-port", "0",
                                    "--bin-dir", bin_dir, "--log-dir",
                                    os.path.join(self.dir, "logs" + "".join(extra)), "--"] + extra,
                                   timeout=30)
            self.assertEqual(rc, 1, out)
            self.assertRegex(out, rf"FAILED: worker 0 \(pid \d+\) failed: {status}\n")
            summary = out.split("FAILED:")[1]
            self.assertIn("    ferry-trainer: training: UNAVAILABLE: server 1 (tcp://h:1) stopped "
                          "answering", summary)
            self.assertNotIn("--flag-", summary)
            self.assertNotIn("step 29 loss", summary)  # an error line was found: only it is shown

    def test_cause_lines(self):
        fl = load_launcher_module()
        usage = ["usage: ferry-ps --bind ENDPOINT [--rank R]", "                [--max-wait-s S]",
                 "  --bind             tcp://HOST:PORT"]
        # Error, then usage: the error alone.
        self.assertEqual(fl.cause_lines(["ferry-ps: unknown flag --x"] + usage),
                         (["ferry-ps: unknown flag --x"], True))
        # Only usage: nothing left, and it says the usage was left out.
        self.assertEqual(fl.cause_lines(usage), ([], True))
        # An error line right after the usage ends it, even with "--" in it.
        self.assertEqual(fl.cause_lines(usage + ["ferry-ps: --bind 'tcp://h:70000': port 70000 "
                                                 "is above 65535"])[0],
                         ["ferry-ps: --bind 'tcp://h:70000': port 70000 is above 65535"])
        # No error line: the last lines, and normal output that merely mentions errors is not
        # taken for one.
        plain = [f"step {i} relative error of w 0.{i}" for i in range(20)]
        self.assertEqual(fl.cause_lines(plain), (plain[-fl.TAIL_LINES:], False))
        # Crash text from C++ and Python, and Ferry's status codes.
        for line in ("terminate called after throwing an instance of 'std::length_error'",
                     "  what():  vector::reserve", "Traceback (most recent call last):",
                     "ValueError: bad", "error: cannot open x", "DATA_LOSS: x.gz: truncated",
                     "ferry: StatusOr::value() called on an error: INTERNAL: x"):
            self.assertEqual(fl.cause_lines(plain + [line] + ["after"])[0], [line], line)
        # The launcher's own notes in a task's log (Slurm) are not the task's errors.
        notes = ["ferry-launch: started worker 1 pid 7: ferry-trainer --rank 1",
                 "stub: failing on purpose", "ferry-launch: worker 1 ended: exit status 3"]
        self.assertEqual(fl.cause_lines(notes), (notes, False))
        self.assertEqual(fl.cause_lines(notes + ["ferry-trainer: data: NOT_FOUND: x"])[0],
                         ["ferry-trainer: data: NOT_FOUND: x"])
        self.assertEqual(fl.cause_lines(["ferry-ps rank 0 of 1 listening on tcp://h:1",
                                         "ferry-ps rank 0: SIGTERM, stopping"])[0],
                         ["ferry-ps rank 0 of 1 listening on tcp://h:1",
                          "ferry-ps rank 0: SIGTERM, stopping"])

    def test_sigterm_to_launcher_leaves_nothing(self):
        bin_dir = self.stub_bin_dir()
        r = Run(["--num-ps", "2", "--num-workers", "2", "--base-port", "0",
                 "--bin-dir", bin_dir, "--log-dir", os.path.join(self.dir, "logs")])
        r.wait_for(r"\[worker 1\] stub trainer rank 1")
        r.wait_for(r"started worker 1 pid")
        r.proc.send_signal(signal.SIGTERM)
        rc = r.finish(30)
        self.assertEqual(rc, 128 + signal.SIGTERM, r.output)
        self.assertIn("stopped by SIGTERM", r.output)
        pids = r.pids()
        self.assertEqual(len(pids), 4, r.output)
        self.assert_all_gone(pids)

    def test_sigkill_to_launcher_leaves_nothing(self):
        # No chance to clean up: the children must still go (PR_SET_PDEATHSIG).
        bin_dir = self.stub_bin_dir()
        r = Run(["--num-ps", "2", "--num-workers", "2", "--base-port", "0",
                 "--bin-dir", bin_dir, "--log-dir", os.path.join(self.dir, "logs")])
        r.wait_for(r"\[worker 1\] stub trainer rank 1")
        r.wait_for(r"started worker 1 pid")  # the pid is known before the signal
        r.proc.send_signal(signal.SIGKILL)
        rc = r.finish(30)
        self.assertEqual(rc, -signal.SIGKILL, r.output)
        pids = r.pids()
        self.assertEqual(len(pids), 4, r.output)
        # They are not our children, so they cannot be waited for: give the kernel a moment.
        deadline = time.monotonic() + 5
        while any(pid_alive(p) for p in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assert_all_gone(pids)

    def test_server_never_up_times_out(self):
        # A "ferry-ps" that never listens: the rendezvous deadline must stop everything.
        d = os.path.join(self.dir, "bin")
        os.makedirs(d)
        for name in ("ferry-ps", "ferry-trainer"):
            with open(os.path.join(d, name), "w") as f:
                f.write(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
            os.chmod(os.path.join(d, name), 0o755)
        t0 = time.monotonic()
        r = Run(["--num-ps", "2", "--num-workers", "1", "--base-port", "0",
                 "--rendezvous-timeout", "3.5", "--bin-dir", d,
                 "--log-dir", os.path.join(self.dir, "logs")])
        rc = r.finish(30)
        self.assertNotEqual(rc, 0, r.output)
        self.assertLess(time.monotonic() - t0, 15)
        self.assertRegex(r.output, r"waiting for ps 1 at 127\.0\.0\.1:\d+, 3 s")
        self.assertIn("rendezvous timed out", r.output)
        self.assertNotIn("started worker", r.output)
        self.assert_all_gone(r.pids())

    def test_unusable_log_dir_is_a_preflight_error(self):
        blocker = os.path.join(self.dir, "a-file")
        open(blocker, "w").close()
        logs = os.path.join(blocker, "logs")
        rc, out = run_launcher(["--num-ps", "1", "--num-workers", "1", "--base-port", "0",
                                "--bin-dir", BUILD_DIR, "--log-dir", logs])
        self.assertEqual(rc, 2, out)
        self.assertIn(f"ferry-launch: error: preflight: --log-dir {logs}: cannot create or "
                      "write there: Not a directory", out)
        self.assertNotIn("Traceback", out)
        self.assertNotIn("started", out)

    def test_stop_all_bounds_the_wait_after_sigkill(self):
        # A process that SIGKILL cannot end (stuck in the kernel): named, then left.
        fl = load_launcher_module()

        class StuckChild:
            pid, returncode, done = 4242424, None, threading.Event()

            def signal_group(self, *_args):
                pass
            kill_group = close_stdin = join_output = signal_group

        launcher = fl.Launcher(fl.Cluster([], []), unittest.mock.Mock(grace=0.1, ssh="ssh"),
                               fl.Console(), fl.StopSignals())
        launcher.procs = [fl.TaskProc(fl.Task("ps", 0, "127.0.0.1", 7000), StuckChild(), None)]
        out = io.StringIO()
        t0 = time.monotonic()
        with unittest.mock.patch.object(fl.common, "REAP_TIMEOUT_S", 0.3), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            launcher.stop_all("test")
        # About 0.4 s (grace, then the reap timeout); without the bound it would never return.
        self.assertLess(time.monotonic() - t0, 10.0)
        self.assertIn("ps 0 pid 4242424 ignored SIGTERM for 0.1 s; sending SIGKILL",
                      out.getvalue())
        self.assertIn("ps 0 (pid 4242424) could not be reaped 0.3 s after SIGKILL",
                      out.getvalue())

    def test_rendezvous_deadline_holds_when_probes_hang(self):
        # Connects (or name lookups) that hang far past their timeout delay neither the
        # deadline nor the progress reports.
        fl = load_launcher_module()
        release = threading.Event()

        def hanging_connect(*_args, **_kwargs):
            release.wait(20)
            raise OSError("released")

        ps = [fl.Task("ps", r, f"ps{r}.example", 7000 + r) for r in range(3)]
        said = []
        t0 = time.monotonic()
        try:
            with unittest.mock.patch.object(fl.socket, "create_connection", hanging_connect), \
                    unittest.mock.patch.object(fl.common, "WAIT_REPORT_EVERY_S", 0.3):
                got = fl.wait_for_servers(ps, 2.0, said.append, lambda s: time.sleep(s))
        finally:
            release.set()
        self.assertEqual(got, "timeout")
        # The deadline (2 s), not the hanging connects (20 s); with room for a loaded machine.
        self.assertLess(time.monotonic() - t0, 10.0)
        # Reports every 0.3 s for 2 s: at least 2 unless this thread got no CPU for over 1.4 s.
        self.assertGreaterEqual(sum(m.startswith("waiting for ps 2 at ps2.example:7002")
                                    for m in said), 2, said)
        self.assertEqual(sum(m.startswith("rendezvous timed out after 2 s") for m in said), 3,
                         said)

    def test_child_exits_if_launcher_died_before_prctl(self):
        fl = load_launcher_module()
        with unittest.mock.patch.object(fl.os, "getpid", return_value=1):
            preexec = fl._die_with_launcher(signal.SIGKILL)  # "launcher" pid 1: not our parent
        r = subprocess.run(["sh", "-c", "echo ran"], preexec_fn=preexec, capture_output=True,
                           text=True, timeout=10)
        self.assertEqual((r.returncode, r.stdout), (1, ""), r.stderr)
        self.assertIn("the launcher died before this process started", r.stderr)

    def test_dry_run_prints_commands(self):
        rc, out = run_launcher(["--num-ps", "2", "--num-workers", "2", "--base-port", "7470",
                                "--bin-dir", BUILD_DIR, "--gpus-per-host", "0", "--dry-run",
                                "--", "--steps", "5"])
        self.assertEqual(rc, 0, out)
        lines = out.splitlines()
        self.assertEqual(len(lines), 4, out)
        self.assertEqual(lines[0], f"[ps 0] {PS_BIN} --bind tcp://127.0.0.1:7470 --rank 0 "
                                   "--num-servers 2 --compute-threads 1 --metrics 127.0.0.1:0 --num-workers 2")
        self.assertEqual(lines[3], f"[worker 1] {TRAINER_BIN} --servers "
                                   "tcp://127.0.0.1:7470,tcp://127.0.0.1:7471 --rank 1 "
                                   "--num-workers 2 --metrics 127.0.0.1:0 --steps 5")


# A worker program (what follows "--" when its first word is not a flag), run as
# `python3 WORKER_PROGRAM OUT MODE`: each start appends what it was told (the environment
# contract, whether `import ferry` works and from where, which servers accepted a TCP connection)
# as a JSON line to OUT/worker-R.jsonl. MODE "ok": exit 0; "die-once": a first start (no
# FERRY_RESUME) dies, worker 0 by SIGKILL, the others with exit status 3, a restarted one says
# "resuming" and exits 0; "fail-1": worker 1 exits 3, the others wait for 60 s;
# "tf-config": also records ferry.cluster_from_tf_config() (the build's module).
PROGRAM_ENV = ["FERRY_SERVERS", "FERRY_RANK", "FERRY_NUM_WORKERS", "FERRY_RESUME",
               "FERRY_CHECKPOINT_EVERY", "FERRY_CURVE_KEYS", "FERRY_METRICS", "FERRY_INCARNATION", "TF_CONFIG", "PYTHONPATH",
               "CUDA_VISIBLE_DEVICES"]
WORKER_PROGRAM = textwrap.dedent(f"""\
    import json, os, signal, socket, sys, time
    out, mode = sys.argv[1], sys.argv[2]
    rank = int(os.environ["FERRY_RANK"])
    seen = {{k: os.environ.get(k) for k in {PROGRAM_ENV!r}}}
    seen["reached"] = []
    for server in os.environ["FERRY_SERVERS"].split(","):
        host, port = server[len("tcp://"):].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10):
            seen["reached"].append(server)
    try:
        import ferry
        seen["ferry"] = ferry.__file__
        if mode == "tf-config":
            seen["tf_config"] = ferry.cluster_from_tf_config()
    except ImportError:
        seen["ferry"] = None
    with open(os.path.join(out, f"worker-{{rank}}.jsonl"), "a") as f:
        f.write(json.dumps(seen) + "\\n")
    resumed = os.environ.get("FERRY_RESUME") == "1"
    if resumed:
        print(f"[worker {{rank}}] resuming the job at step 0 of 10", flush=True)
    if mode == "die-once" and not resumed:
        if rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(3)
    if mode == "fail-1":
        if rank == 1:
            sys.exit(3)
        time.sleep(60)
    print(f"[worker {{rank}}] done", flush=True)
    """)


def program_starts(out_dir, rank):
    """What each start of worker rank's program was told, in order (see WORKER_PROGRAM)."""
    with open(os.path.join(out_dir, f"worker-{rank}.jsonl")) as f:
        return [json.loads(line) for line in f]


def write_worker_program(parent):
    """Writes WORKER_PROGRAM to PARENT/worker.py and makes PARENT/out for what it records;
    returns (program, out)."""
    program, out = os.path.join(parent, "worker.py"), os.path.join(parent, "out")
    with open(program, "w") as f:
        f.write(WORKER_PROGRAM)
    os.makedirs(out)
    return program, out


def make_program_bin_dir(parent):
    """A flat bin dir for jobs whose workers run a program: the real ferry-ps (no
    ferry-trainer: they need none) and python/ferry, a stand-in for the build tree's package."""
    d = os.path.join(parent, "bin")
    os.makedirs(os.path.join(d, "python", "ferry"))
    os.symlink(PS_BIN, os.path.join(d, "ferry-ps"))
    with open(os.path.join(d, "python", "ferry", "__init__.py"), "w") as f:
        f.write("# a stand-in for the build tree's package\n")
    return d


def listening(output):
    """{"ps R": "tcp://HOST:PORT"} from the servers' own "listening on" lines."""
    return {f"ps {m.group(1)}": m.group(2) for m in
            re.finditer(r"^\[ps \d+\] ferry-ps rank (\d+) of \d+ listening on (tcp://\S+)",
                        output, re.M)}


@unittest.skipUnless(os.access(PS_BIN, os.X_OK), f"ferry-ps not built under {BUILD_DIR}")
class WorkerProgramTest(unittest.TestCase):
    """Workers that run a program instead of ferry-trainer (`-- PROGRAM ARGS...`): what it is
    told in its environment, restarts (FERRY_RESUME=1), preflight, --dry-run. With the real
    ferry-ps and a Python program written by the test."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-launch-test-")
        self.dir = self.tmp.name
        self.program, self.out = write_worker_program(self.dir)

    def tearDown(self):
        self.tmp.cleanup()

    def command(self, mode):
        return [sys.executable, self.program, self.out, mode]

    def assert_all_gone(self, output):
        pids = all_pids(output)
        self.assertTrue(pids)
        wait_until_gone([pid for _, pid in pids])
        self.assertEqual([f"{who} pid {pid}" for who, pid in pids if pid_alive(pid)], [],
                         "processes survived the launcher")

    def test_program_is_told_its_place_in_its_environment(self):
        bin_dir = make_program_bin_dir(self.dir)
        folder = os.path.join(self.dir, "ckpt")
        # Names of the contract in the launcher's own environment do not leak through.
        rc, out = run_launcher(["--num-ps", "2", "--num-workers", "3", "--base-port", "0",
                                "--gpus-per-host", "2", "--bin-dir", bin_dir, "--log-dir",
                                os.path.join(self.dir, "logs"), "--checkpoint-dir", folder,
                                "--checkpoint-every", "7", "--"] + self.command("ok"),
                               timeout=60, env={"PYTHONPATH": "/inherited/a:/inherited/b",
                                                "FERRY_RESUME": "1", "FERRY_CURVE_KEYS": "/k",
                                                "FERRY_INCARNATION": "7", "TF_CONFIG": "{}"})
        self.assertEqual(rc, 0, out)
        servers = listening(out)
        self.assertEqual(sorted(servers), ["ps 0", "ps 1"], out)
        want_servers = f"{servers['ps 0']},{servers['ps 1']}"
        ps = [s[len("tcp://"):] for s in (servers["ps 0"], servers["ps 1"])]
        fl = load_launcher_module()
        for rank in range(3):
            starts = program_starts(self.out, rank)
            self.assertEqual(len(starts), 1, out)
            seen = starts[0]
            tf_config = json.loads(seen.pop("TF_CONFIG"))
            self.assertEqual(seen, {
                "FERRY_SERVERS": want_servers, "FERRY_RANK": str(rank),
                "FERRY_NUM_WORKERS": "3", "FERRY_RESUME": None, "FERRY_CHECKPOINT_EVERY": "7",
                "FERRY_CURVE_KEYS": None, "FERRY_METRICS": "127.0.0.1:0", "FERRY_INCARNATION": None,
                "PYTHONPATH": f"{os.path.join(bin_dir, 'python')}:/inherited/a:/inherited/b",
                "CUDA_VISIBLE_DEVICES": str(rank % 2),
                "reached": want_servers.split(","),
                "ferry": os.path.join(bin_dir, "python", "ferry", "__init__.py")})
            self.assertEqual(tf_config["task"], {"type": "worker", "index": rank})
            self.assertEqual(tf_config["cluster"]["ps"], ps)
            # The same cluster, as the launcher reads a spec: also a valid --spec.
            cluster = fl.spec.parse_spec(tf_config)
            self.assertEqual([t.address for t in cluster.ps], ps)
            self.assertEqual([t.host for t in cluster.workers], ["127.0.0.1"] * 3)
            self.assertRegex(out, rf"started worker {rank} pid \d+: CUDA_VISIBLE_DEVICES="
                                  rf"{rank % 2} FERRY_CHECKPOINT_EVERY=7 FERRY_METRICS=127.0.0.1:0 FERRY_NUM_WORKERS=3 "
                                  rf"FERRY_RANK={rank} FERRY_SERVERS={re.escape(want_servers)} "
                                  rf"PYTHONPATH=\S+ TF_CONFIG=\S+ "
                                  rf"{re.escape(shlex.join(self.command('ok')))}\n")
        self.assertIn("done: 3 workers finished, 2 servers stopped", out)
        self.assert_all_gone(out)

    def test_tf_config_parses_with_the_ferry_module(self):
        # The build's own package, when it is there and this interpreter loads it: its
        # cluster_from_tf_config (messages/src/cluster.cc) reads the same cluster.
        python = os.path.join(BUILD_DIR, "python")
        probe = subprocess.run([sys.executable, "-c", "import ferry; ferry.cluster_from_tf_config"],
                               env=dict(launcher_env(), PYTHONPATH=python), capture_output=True,
                               timeout=60)
        if not os.path.exists(os.path.join(python, "ferry")) or probe.returncode != 0:
            self.skipTest(f"the build's package ferry does not load here from {python}")
        rc, out = run_launcher(["--num-ps", "2", "--num-workers", "2", "--base-port", "0",
                                "--gpus-per-host", "0", "--bin-dir", BUILD_DIR, "--log-dir",
                                os.path.join(self.dir, "logs"), "--"] + self.command("tf-config"),
                               timeout=60)
        self.assertEqual(rc, 0, out)
        servers = listening(out)
        for rank in range(2):
            seen = program_starts(self.out, rank)[0]
            self.assertTrue(seen["ferry"].startswith(python + os.sep), seen)
            self.assertEqual(seen["tf_config"]["servers"], [servers["ps 0"], servers["ps 1"]])
            self.assertEqual(seen["tf_config"]["servers"], seen["FERRY_SERVERS"].split(","))
            self.assertEqual((seen["tf_config"]["rank"], seen["tf_config"]["num_workers"],
                              seen["tf_config"]["task_type"]), (rank, 2, "worker"))
        self.assert_all_gone(out)

    def test_dead_program_is_restarted_with_ferry_resume(self):
        bin_dir = make_program_bin_dir(self.dir)
        rc, out = run_launcher(["--num-ps", "1", "--num-workers", "2", "--base-port", "0",
                                "--gpus-per-host", "0", "--bin-dir", bin_dir, "--log-dir",
                                os.path.join(self.dir, "logs"), "--"] + self.command("die-once"),
                               timeout=60)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"worker 0 \(pid \d+\) died \(killed by SIGKILL\); restarting it "
                              r"with FERRY_RESUME=1")
        self.assertRegex(out, r"worker 1 \(pid \d+\) died \(exit status 3\); restarting it "
                              r"with FERRY_RESUME=1")
        for rank in range(2):
            # Its start number, by which the servers give the rank to the restarted process.
            self.assertRegex(out, rf"restarted worker {rank} pid \d+: FERRY_INCARNATION=1 FERRY_METRICS=127.0.0.1:0 "
                                  r"FERRY_NUM_WORKERS=2 "
                                  rf"FERRY_RANK={rank} FERRY_RESUME=1 FERRY_SERVERS=\S+ "
                                  r"PYTHONPATH=\S+ TF_CONFIG=\S+ "
                                  rf"{re.escape(shlex.join(self.command('die-once')))}\n")
            starts = program_starts(self.out, rank)
            self.assertEqual([s["FERRY_RESUME"] for s in starts], [None, "1"], out)
            self.assertEqual([s["FERRY_INCARNATION"] for s in starts], [None, "1"], out)
            self.assertEqual(starts[0]["TF_CONFIG"], starts[1]["TF_CONFIG"])
            self.assertRegex(out, rf"recovery \d of at most 3: worker {rank} \(pid \d+\) died .*; "
                                  rf"restarted worker {rank} with FERRY_RESUME=1 \(pid \d+\); it "
                                  "rejoined the job at step 0")
        self.assertIn("recovery summary: 2 restarts of at most 3 (2 after a worker died, 0 after "
                      "a server died)", out)
        self.assertIn("done: 2 workers finished, 1 servers stopped", out)
        self.assert_all_gone(out)

    def test_no_restarts_the_job_fails_naming_the_worker(self):
        bin_dir = make_program_bin_dir(self.dir)
        rc, out = run_launcher(["--num-ps", "1", "--num-workers", "2", "--base-port", "0",
                                "--gpus-per-host", "0", "--max-restarts", "0", "--grace", "1",
                                "--bin-dir", bin_dir, "--log-dir", os.path.join(self.dir, "logs"),
                                "--"] + self.command("fail-1"), timeout=60)
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, r"FAILED: worker 1 \(pid \d+\) failed: exit status 3\n")
        self.assertNotIn("restarted", out)
        self.assertEqual(len(program_starts(self.out, 1)), 1)
        self.assert_all_gone(out)

    def test_missing_program_is_refused_before_anything_starts(self):
        bin_dir = make_program_bin_dir(self.dir)
        not_executable = os.path.join(self.dir, "train.sh")
        with open(not_executable, "w") as f:
            f.write("#!/bin/sh\n")
        base = ["--num-ps", "1", "--num-workers", "2", "--base-port", "0", "--gpus-per-host",
                "0", "--bin-dir", bin_dir, "--log-dir", os.path.join(self.dir, "logs"), "--"]
        for program, why in [("no-such-ferry-program", "no such command on PATH"),
                             (os.path.join(self.dir, "nowhere", "train.py"),
                              "no executable file there"),
                             (not_executable, "no executable file there")]:
            with self.subTest(program=program):
                rc, out = run_in_process(base + [program, "--epochs", "3"])
                self.assertEqual(rc, 2, out)
                self.assertIn(f"ferry-launch: error: preflight: worker program not found: "
                              f"{program} ({why}", out)
                self.assertNotIn("started", out)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "logs")))

    def test_dry_run_shows_the_command_and_its_environment(self):
        empty_bin = os.path.join(self.dir, "flat")  # no python/ferry: PYTHONPATH left alone
        os.makedirs(empty_bin)
        os.symlink(PS_BIN, os.path.join(empty_bin, "ferry-ps"))
        keys = os.path.join(self.dir, "keys")
        rc, out = run_in_process(["--num-ps", "2", "--num-workers", "2", "--base-port", "7470",
                                  "--gpus-per-host", "0", "--bin-dir", empty_bin, "--curve-keys",
                                  keys, "--resume", os.path.join(self.dir, "ckpt"),
                                  "--checkpoint-every", "50", "--dry-run", "--",
                                  "/usr/bin/python3", "train.py", "--epochs", "3"])
        self.assertEqual(rc, 0, out)
        cluster = {"cluster": {"ps": ["127.0.0.1:7470", "127.0.0.1:7471"],
                               "worker": ["127.0.0.1:7472", "127.0.0.1:7473"]},
                   "task": {"type": "worker", "index": 1}}
        self.assertIn(f"[worker 1] FERRY_CHECKPOINT_EVERY=50 FERRY_CURVE_KEYS={keys} "
                      "FERRY_METRICS=127.0.0.1:0 FERRY_NUM_WORKERS=2 FERRY_RANK=1 FERRY_RESUME=1 "
                      "FERRY_SERVERS=tcp://127.0.0.1:7470,tcp://127.0.0.1:7471 "
                      f"TF_CONFIG={shlex.quote(json.dumps(cluster, separators=(',', ':')))} "
                      "/usr/bin/python3 train.py --epochs 3\n", out)
        self.assertIn(" --restore", command_lines(out)["ps 0"])
        self.assertIn("a dead worker restarts alone with FERRY_RESUME=1; a dead server: all "
                      "processes restart, servers with --restore (from the newest checkpoint), "
                      "workers with FERRY_RESUME=1", out)
        self.assertNotIn("warning", out)
        # With the build tree's package: PYTHONPATH; a python3 other than /usr/bin/python3 (the
        # first on PATH here): a one-line warning; the launcher's own trainer flags are no
        # business of a program's arguments.
        bin_dir = make_program_bin_dir(self.dir)
        other = os.path.join(self.dir, "pyenv")
        os.makedirs(other)
        write_script(os.path.join(other, "python3"), "#!/bin/sh\nexec /usr/bin/python3 \"$@\"\n")
        rc, out = run_in_process(["--num-ps", "1", "--num-workers", "1", "--base-port", "7470",
                                  "--gpus-per-host", "0", "--bin-dir", bin_dir, "--dry-run", "--",
                                  "python3", "train.py", "--rank", "9", "--servers", "x"],
                                 env={"PATH": f"{other}:{os.environ['PATH']}"})
        self.assertEqual(rc, 0, out)
        self.assertIn(f"ferry-launch: warning: the worker program python3 is {other}/python3, "
                      "not /usr/bin/python3", out)
        self.assertEqual(len([l for l in out.splitlines() if "warning" in l]), 1, out)
        self.assertRegex(out, rf"\[worker 0\] FERRY_METRICS=127.0.0.1:0 FERRY_NUM_WORKERS=1 FERRY_RANK=0 "
                              rf"FERRY_SERVERS=tcp://127.0.0.1:7470 PYTHONPATH="
                              rf"{re.escape(bin_dir)}/python\${{PYTHONPATH:\+:\$PYTHONPATH}} "
                              r"TF_CONFIG=\S+ python3 train.py --rank 9 --servers x\n")


# A short sync job (2 servers, 2 workers) that checkpoints every 20 steps. Worker 1 is slowed
# down by 10 ms a step (--straggler; it changes no number), so the 200 steps take about 2 s and a
# process can be killed in the middle; --log-every 10 gives the launcher the steps reached.
RECOVERY_TRAINING = ["--model", "mlp", "--hidden", "64", "--optimizer", "adam", "--lr", "0.001",
                     "--batch", "64", "--steps", "200", "--train-limit", "6000",
                     "--test-limit", "1000", "--blas-threads", "1", "--log-every", "10",
                     "--straggler", "1:10ms"]
_BASELINE = []  # the uninterrupted run's (test loss, accuracy), computed once


def final_eval(output):
    """(test loss, accuracy) as printed on worker 0's last "done:" line, or None."""
    found = re.findall(r"^\[worker 0\] done: .*; test loss (\S+), accuracy (\S+)$", output, re.M)
    return found[-1] if found else None


def all_pids(output):
    """[(name, pid)] of every process a launcher started or restarted, in order."""
    return [(m.group(1), int(m.group(2)))
            for m in re.finditer(r"started (\w+ \d+) pid (\d+)", output)]


@unittest.skipUnless(os.access(PS_BIN, os.X_OK) and os.access(TRAINER_BIN, os.X_OK),
                     f"ferry-ps / ferry-trainer not built under {BUILD_DIR}")
class RecoveryTest(unittest.TestCase):
    """Restarts (--max-restarts) and checkpoints (--checkpoint-dir, --checkpoint-every,
    --resume) with the real binaries: a worker, a server and the launcher killed with SIGKILL in
    the middle of a short sync job, which finishes with the very numbers of an uninterrupted run
    (sync without backup workers is deterministic: a restarted worker recomputes the same
    gradients, and servers restored from a checkpoint hold exactly the state they saved)."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-launch-test-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def args(self, name, resume=False, extra=()):
        folder = os.path.join(self.dir, "ckpt")
        return (["--num-ps", "2", "--num-workers", "2", "--base-port", "0", "--gpus-per-host",
                 "0", "--bin-dir", BUILD_DIR, "--log-dir", os.path.join(self.dir, name)]
                + (["--resume", folder] if resume else ["--checkpoint-dir", folder])
                + ["--checkpoint-every", "20"] + list(extra) + ["--"] + RECOVERY_TRAINING)

    def baseline(self):
        """The final (test loss, accuracy) of the job run without interruption."""
        if not _BASELINE:
            rc, out = run_launcher(self.args("baseline"), timeout=60)
            self.assertEqual(rc, 0, out)
            self.assertNotIn("restart", out)
            _BASELINE.append(final_eval(out))
            self.assertIsNotNone(_BASELINE[0], out)
            shutil.rmtree(os.path.join(self.dir, "ckpt"))
        return _BASELINE[0]

    def assert_all_gone(self, output):
        pids = all_pids(output)
        self.assertTrue(pids)
        wait_until_gone([pid for _, pid in pids])
        self.assertEqual([f"{who} pid {pid}" for who, pid in pids if pid_alive(pid)], [],
                         "processes survived the launcher")

    def test_worker_killed_is_restarted_alone(self):
        want = self.baseline()
        r = Run(self.args("logs"))
        r.wait_for(r"^\[worker 0\] checkpoint of step 60 saved", 30)
        victim = r.pids()["worker 0"]
        os.kill(victim, signal.SIGKILL)
        rc = r.finish(60)
        out = r.output
        self.assertEqual(rc, 0, out)
        self.assertIn(f"worker 0 (pid {victim}) died (killed by SIGKILL); restarting it with "
                      "--resume", out)
        m = re.search(rf"recovery 1 of at most 3: worker 0 \(pid {victim}\) died \(killed by "
                      r"SIGKILL\); restarted worker 0 with --resume \(pid (\d+)\); it rejoined "
                      r"the job at step (\d+); steps lost: 0 \(last step it reported before the "
                      r"death: (\d+)\); recovery time ([\d.]+) s", out)
        self.assertTrue(m, out)
        step, before, seconds = int(m.group(2)), int(m.group(3)), float(m.group(4))
        self.assertGreaterEqual(before, 60)
        self.assertGreaterEqual(step, before)  # sync: it rejoins at the global step
        self.assertLess(seconds, 30)
        self.assertRegex(out, rf"\[worker 0\] resuming the job at step {step} of 200")
        self.assertNotIn("stopping ps 0, ps 1, worker", out)  # the others went on
        self.assertIn("recovery summary: 1 restart of at most 3 (1 after a worker died, 0 after "
                      "a server died); steps lost: 0; recovery time", out)
        # Usually bitwise the run without the death; but a kill that lands while the push of a
        # step had reached one server and not the other changes that one step's gradient on the
        # second (PROTOCOL.md, "Known hole"): 0.5309 and 0.5317 against 0.5314 seen under load.
        # Within a step's difference, then: a restart that lost or repeated steps is far more.
        got = final_eval(out)
        self.assertIsNotNone(got, out)
        self.assertAlmostEqual(float(got[0]), float(want[0]), delta=0.002, msg=out)
        self.assertAlmostEqual(float(got[1]), float(want[1]), delta=0.005, msg=out)
        with open(os.path.join(self.dir, "logs", "worker-0.log")) as f:
            log = f.read()  # both runs of worker 0
        self.assertIn("ferry-launch: restart 1: worker 0 starts again: ", log)
        self.assertIn("checkpoint of step 60 saved", log.split("restart 1:")[0])
        print(f"\n  worker SIGKILL: rejoined at step {step} (last reported {before}), "
              f"recovery {seconds:.2f} s", file=sys.stderr)
        self.assert_all_gone(out)

    def kill_ps_1_after_step_60_checkpoint(self, argv, then=None):
        """Runs the job (argv: the launcher's), SIGKILLs ps 1 once step 60 is checkpointed (and a
        line `then` has come), and checks that the job ends well: (pid killed, output)."""
        r = Run(argv)
        r.wait_for(r"^\[worker 0\] checkpoint of step 60 saved", 30)
        if then:
            r.wait_for(then, 30)
        victim = r.pids()["ps 1"]
        os.kill(victim, signal.SIGKILL)
        rc = r.finish(60)
        self.assertEqual(rc, 0, r.output)
        return victim, r.output

    def test_server_killed_all_restart_from_the_checkpoint(self):
        want = self.baseline()
        victim, out = self.kill_ps_1_after_step_60_checkpoint(self.args("logs"), then=r"^\[worker \d\] step 70/200 ")
        m = re.search(rf"recovery 1 of at most 3: ps 1 \(pid {victim}\) died \(killed by "
                      r"SIGKILL\); restarted ps 0, ps 1 with --restore and worker 0, worker 1 "
                      r"with --resume; the job resumed at step (\d+), the step of the checkpoint "
                      r"restored; steps lost: (\d+) \(last step a worker reported before the "
                      r"death: (\d+)\); recovery time ([\d.]+) s", out)
        self.assertTrue(m, out)
        step, lost, before, seconds = (int(m.group(1)), int(m.group(2)), int(m.group(3)),
                                       float(m.group(4)))
        self.assertGreaterEqual(step, 60)
        self.assertEqual(step % 20, 0)  # a checkpoint's step
        self.assertGreaterEqual(before, 70)
        self.assertEqual(lost, before - step)
        self.assertLess(seconds, 30)
        for rank in (0, 1):
            self.assertIn(f"[ps {rank}] ferry-ps rank {rank}: restored the checkpoint of step "
                          f"{step} from", out)
            self.assertIn(f"[worker {rank}] resuming the job at step {step} of 200", out)
        self.assertIn(f"recovery summary: 1 restart of at most 3 (0 after a worker died, 1 after "
                      f"a server died); steps lost: {lost}; recovery time", out)
        self.assertEqual(final_eval(out), want, out)
        print(f"\n  server SIGKILL: resumed at step {step}, last reported {before}, steps lost "
              f"{lost}, recovery {seconds:.2f} s", file=sys.stderr)
        self.assert_all_gone(out)

    def test_server_killed_restarts_from_a_chain_of_delta_checkpoints(self):
        # The servers write a full checkpoint and then deltas (--checkpoint-deltas 3; the MLP's
        # every chunk changes each step, so --checkpoint-delta-share 100 lets deltas be as large
        # as a full one); ps 1 is killed after step 60's, a delta over steps 20 and 40: every
        # process restarts from that chain, and the job ends with the uninterrupted run's numbers.
        want = self.baseline()
        victim, out = self.kill_ps_1_after_step_60_checkpoint(
            self.args("logs", extra=["--ps-arg", "--checkpoint-deltas 3 --checkpoint-delta-share 100"]),
            then=r"^\[worker \d\] step 70/200 ")
        for rank in (0, 1):
            self.assertRegex(out, rf"\[ps {rank}\] ferry-ps {rank}: checkpoint of step 60: \S+ \(a delta of step "
                                  r"40\)")
        m = re.search(rf"recovery 1 of at most 3: ps 1 \(pid {victim}\) died .*; the job resumed at step "
                      r"(\d+), the step of the checkpoint restored", out)
        self.assertTrue(m, out)
        step = int(m.group(1))
        self.assertIn(step, (60, 80), out)  # 80: a delta over 20, 40, 60, if saved before the kill
        for rank in (0, 1):
            self.assertIn(f"[ps {rank}] ferry-ps rank {rank}: restored the checkpoint of step {step} from", out)
        self.assertEqual(final_eval(out), want, out)
        self.assert_all_gone(out)

    def test_async_criteo_stream_killed_twice_trains_on_each_example_once_per_pass(self):
        # Exactly once across restarts (issue 36): an async ctr job streaming Criteo files, each
        # worker its own file of 120 distinct lines (12 steps of 10 a pass, 36 steps: 3 passes),
        # with --audit-examples counting on the servers every example trained on. ps 1 is
        # SIGKILLed twice; each time every process restarts from the newest checkpoint, each
        # worker at its own step, past its examples of the steps before. In the final checkpoint
        # every example of the files has been counted exactly 3 times. (Whether a checkpoint cut
        # a worker's step between the servers, so that a replayed step is skipped where it was
        # held, is up to timing here: CheckpointRequests.AnAsyncPushReplayedAfterARestore... in
        # tests/cluster/checkpoint_request_test.cc makes that happen.)
        rng = random.Random(36)
        data = os.path.join(self.dir, "data")
        os.makedirs(data)
        for name, n in (("day_0.tsv", 120), ("day_1.tsv", 120), ("test.tsv", 40)):
            lines = []
            for _ in range(n):
                ints = [str(rng.randrange(100000)) for _ in range(13)]
                cats = ["%08x" % rng.getrandbits(32) for _ in range(26)]
                lines.append("\t".join([str(rng.randrange(2))] + ints + cats))
            with open(os.path.join(data, name), "w") as f:
                f.write("\n".join(lines) + "\n")
        folder = os.path.join(self.dir, "ckpt")
        argv = (["--num-ps", "2", "--num-workers", "2", "--base-port", "0", "--gpus-per-host", "0",
                 "--bin-dir", BUILD_DIR, "--log-dir", os.path.join(self.dir, "logs"),
                 "--checkpoint-dir", folder, "--checkpoint-every", "6", "--",
                 "--model", "ctr", "--device", "cpu", "--consistency", "async", "--batch", "10",
                 "--steps", "36", "--emb-dim", "4", "--hidden", "8", "--blas-threads", "1",
                 "--criteo-train", os.path.join(data, "day_*.tsv"),
                 "--criteo-test", os.path.join(data, "test.tsv"), "--audit-examples",
                 "--straggler", "0:40ms"])  # worker 0 paces the kills: its checkpoints say when
        r = Run(argv)
        for killed, after in enumerate((12, 24)):
            r.wait_for(rf"^\[worker 0\] checkpoint of step {after} saved", 60)
            os.kill(r.pids()["ps 1"], signal.SIGKILL)
            r.wait_for(rf"recovery {killed + 1} of at most 3: ps 1 ", 60)
        rc = r.finish(120)
        self.assertEqual(rc, 0, r.output)
        self.assertRegex(r.output, r"recovery summary: 2 restarts? of at most 3 \(0 after a worker died, 2 after a "
                                   r"server died\)")
        out = os.path.join(self.dir, "audit")
        dump = subprocess.run([os.path.join(BUILD_DIR, "bin", "ferry-ckpt"), "dump", folder, "ctr/audit", out],
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(dump.returncode, 0, dump.stdout + dump.stderr)
        self.assertIn("step 36", dump.stdout + dump.stderr)
        ids, counts = read_npy(out + ".ids.npy"), read_npy(out + ".rows.npy")
        self.assertEqual(len(ids), 240, "one row per example of the files")
        self.assertEqual(sorted(set(counts)), [3.0], collections.Counter(counts))
        self.assert_all_gone(r.output)

    def test_async_server_killed_each_worker_resumes_at_its_own_step(self):
        # Async: each worker counts its own steps (worker 1 is slowed down); the checkpoint
        # records both (worker_steps in its manifest), each resumes at its own, and the steps
        # lost are each one's since then. Before protocol 1.11 both resumed at the checkpoint's
        # step, worker 0's, and the launcher counted worker 1's step less worker 0's as lost.
        victim, out = self.kill_ps_1_after_step_60_checkpoint(
            self.args("logs", extra=["--ps-arg", "--keep-checkpoints 20"]) + ["--consistency", "async"])
        m = re.search(rf"recovery 1 of at most 3: ps 1 \(pid {victim}\) died \(killed by SIGKILL\); .*; "
                      r"each worker resumed at its own step in the checkpoint restored \(the lowest: \d+\); "
                      r"steps lost: (\d+), of the workers' own steps \(each worker's last step reported before "
                      r"the death -> the step it resumed at: worker 0 (\d+) -> (\d+), worker 1 (\d+|\(none\)) -> "
                      r"(\d+)\)", out)
        self.assertTrue(m, out)
        lost, b0, s0, s1 = (int(g) for g in m.group(1, 2, 3, 5))
        b1 = int(m.group(4)) if m.group(4) != "(none)" else s1  # worker 1 had reported no step
        self.assertGreaterEqual(s0, 60)
        self.assertEqual(s0 % 20, 0)  # worker 0 asks for the checkpoints: its step is the checkpoint's
        self.assertEqual(lost, max(0, b0 - s0) + max(0, b1 - s1))
        self.assertIn(f"[worker 0] resuming the job at step {s0} of 200 of its own", out)
        self.assertIn(f"[worker 1] resuming the job at step {s1} of 200 of its own", out)
        with open(os.path.join(self.dir, "ckpt", f"MANIFEST-{s0:020d}")) as f:
            self.assertEqual(json.load(f)["worker_steps"], [s0, s1])
        self.assertIn(f"steps lost: {lost} (async/ssp: in the workers' own steps)", out)
        print(f"\n  async server SIGKILL: worker 0 {b0} -> {s0}, worker 1 {b1} -> {s1}, steps lost {lost}",
              file=sys.stderr)
        self.assert_all_gone(out)

    def stop_after_step_60_checkpoint(self, who):
        """Runs the job, SIGSTOPs `who` once step 60 is checkpointed, and checks that the job ends
        well and the launcher said it killed the stopped process: (uninterrupted result, pid, log)."""
        want = self.baseline()
        r = Run(self.args("logs"))
        r.wait_for(r"^\[worker 0\] checkpoint of step 60 saved", 30)
        victim = r.pids()[who]
        os.kill(victim, signal.SIGSTOP)
        rc = r.finish(90)
        out = r.output
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, rf"{who} \(pid {victim}\) has been stopped \(state T\) for [\d.]+ s; "
                              "killing it with SIGKILL")
        # What the stop cost the job: the time it was stopped, then the recovery's.
        stopped = re.search(r"has been stopped \(state T\) for ([\d.]+) s", out).group(1)
        recovery = re.search(r"steps lost: (\d+).*recovery time ([\d.]+) s", out)
        self.assertIsNotNone(recovery, out)
        print(f"\n  {who} SIGSTOP: killed after {stopped} s stopped; steps lost {recovery.group(1)}, "
              f"recovery {recovery.group(2)} s", file=sys.stderr)
        return want, victim, out

    def test_stopped_worker_is_killed_and_restarted_alone(self):
        # A worker stopped with SIGSTOP (hung, swapped out) would stall the sync step until the
        # servers gave up on it and failed the other worker, which the launcher would then restart
        # in its place, again and again. The launcher kills the stopped one instead; it restarts
        # and the job ends with (about) the uninterrupted run's numbers.
        want, victim, out = self.stop_after_step_60_checkpoint("worker 1")
        self.assertRegex(out, rf"recovery 1 of at most 3: worker 1 \(pid {victim}\) died \(killed by "
                              r"SIGKILL from the launcher, after it had been stopped for [\d.]+ s\); "
                              r"restarted worker 1 with --resume \(pid \d+\); it rejoined the job at step \d+")
        # The healthy worker kept its place: it was neither restarted nor failed.
        self.assertEqual([who for who, _ in all_pids(out)].count("worker 0"), 1, out)
        self.assertNotIn("worker 0 (pid", out.split("has been stopped")[1].split("recovery summary")[0])
        got = final_eval(out)
        self.assertIsNotNone(got, out)
        self.assertAlmostEqual(float(got[0]), float(want[0]), delta=0.002, msg=out)
        self.assertAlmostEqual(float(got[1]), float(want[1]), delta=0.005, msg=out)
        self.assert_all_gone(out)

    def test_stopped_server_is_killed_and_all_restart_from_the_checkpoint(self):
        # A server stopped with SIGSTOP: the workers would fail on their heartbeats and be
        # restarted against a server that never answers. The launcher kills it: its death
        # restarts every process from the checkpoint, and the job ends with the very numbers of
        # the uninterrupted run.
        want, victim, out = self.stop_after_step_60_checkpoint("ps 0")
        self.assertRegex(out, rf"recovery 1 of at most 3: ps 0 \(pid {victim}\) died \(killed by SIGKILL "
                              r"from the launcher, after it had been stopped for [\d.]+ s\); restarted ps 0, "
                              r"ps 1 with --restore")
        self.assertEqual(final_eval(out), want, out)
        self.assert_all_gone(out)

    def test_no_kill_of_a_stopped_process_when_asked(self):
        # --kill-stopped-after 0: the launcher leaves a stopped process alone (the test continues
        # it after a while, and the job ends as usual).
        r = Run(self.args("logs", extra=["--kill-stopped-after", "0"]))
        r.wait_for(r"^\[worker 0\] step 20/200 ", 30)
        victim = r.pids()["worker 1"]
        os.kill(victim, signal.SIGSTOP)
        time.sleep(3)
        os.kill(victim, signal.SIGCONT)
        rc = r.finish(90)
        self.assertEqual(rc, 0, r.output)
        self.assertNotIn("has been stopped", r.output)
        self.assertNotIn("restart", r.output)
        self.assert_all_gone(r.output)

    def test_diverging_job_ends_at_once_and_is_not_restarted(self):
        # lr 1e30 blows the model up after one step; the servers refuse the NaN gradients. The
        # job ends within seconds naming the refusal (the worker, the table), without a restart:
        # one would compute the same gradient again.
        training = [("1e30" if a == "0.001" else "sgd" if a == "adam" else a) for a in RECOVERY_TRAINING]
        args = self.args("logs")
        args = args[:args.index("--") + 1] + training
        start = time.monotonic()
        rc, out = run_launcher(args, timeout=60)
        self.assertEqual(rc, 1, out)
        self.assertLess(time.monotonic() - start, 60)
        self.assertRegex(out, r"FAILED: worker \d \(pid \d+\) failed: exit status 2")
        self.assertRegex(out, r"table 'mlp/\w+' chunk \d+: the gradient of worker \d holds NaN or Inf")
        self.assertRegex(out, r"worker \d is not restarted: exit status 2 is the trainer's refusal of its "
                              r"settings .*the servers' refusal of its gradient")
        self.assertNotIn("restarting it", out)
        self.assertNotIn("DEADLINE_EXCEEDED", out)
        self.assert_all_gone(out)

    def test_launcher_killed_then_resume(self):
        want = self.baseline()
        r = Run(self.args("logs"))
        r.wait_for(r"^\[worker 0\] checkpoint of step 60 saved", 30)
        r.wait_for(r"started worker 1 pid")
        r.proc.send_signal(signal.SIGKILL)
        self.assertEqual(r.finish(30), -signal.SIGKILL)
        pids = r.pids()
        self.assertEqual(sorted(pids), ["ps 0", "ps 1", "worker 0", "worker 1"], r.output)
        self.assert_all_gone(r.output)  # PR_SET_PDEATHSIG: they died with the launcher
        rc, out = run_launcher(self.args("resumed", resume=True), timeout=60)
        self.assertEqual(rc, 0, out)
        m = re.search(r"--resume: the job goes on from \S+: its newest checkpoint is "
                      r"MANIFEST-0*(\d+) \(step (\d+);", out)
        self.assertTrue(m, out)
        step = int(m.group(2))
        self.assertGreaterEqual(step, 60)
        self.assertRegex(out, r"started ps 0 pid \d+: .* --checkpoint-dir \S+ --restore\n")
        self.assertRegex(out, r"started worker 1 pid \d+: .* --checkpoint-every 20 --resume ")
        for rank in (0, 1):
            self.assertIn(f"[ps {rank}] ferry-ps rank {rank}: restored the checkpoint of step "
                          f"{step} from", out)
            self.assertIn(f"[worker {rank}] resuming the job at step {step} of 200", out)
        self.assertNotIn("recovery", out)
        self.assertEqual(final_eval(out), want, out)
        self.assert_all_gone(out)

    def test_restarts_are_bounded(self):
        # A stub worker 1 that always fails: restarted twice (--max-restarts 2), then the job
        # stops; the worker it replaced each time never said "resuming".
        bin_dir = make_stub_bin_dir(self.dir)
        rc, out = run_launcher(["--num-ps", "1", "--num-workers", "2", "--base-port", "0",
                                "--grace", "1", "--max-restarts", "2", "--bin-dir", bin_dir,
                                "--log-dir", os.path.join(self.dir, "logs"), "--",
                                "--stub-fail-rank", "1"], timeout=30)
        self.assertEqual(rc, 1, out)
        # On a machine with a GPU the command line starts with the card the worker is given.
        # Each restart carries the worker's start number: the servers give the rank to it.
        for incarnation in (1, 2):
            self.assertEqual(len(re.findall(r"restarted worker 1 pid \d+: (?:CUDA_VISIBLE_DEVICES=\S+ )?"
                                            r"\S+ferry-trainer .* --num-workers 2 --metrics 127.0.0.1:0 --resume "
                                            rf"--stub-fail-rank 1 --incarnation {incarnation}\n", out)),
                             1, out)
        self.assertRegex(out, r"FAILED: worker 1 \(pid \d+\) failed: exit status 3\n")
        self.assertIn("worker 1 is not restarted: --max-restarts 2 allows no more restarts",
                      out)
        self.assertIn("recovery summary: 2 restarts of at most 2 (2 after a worker died, 0 after "
                      "a server died); steps lost: 0; 2 not complete", out)
        self.assert_all_gone(out)

    def test_what_is_not_restarted(self):
        # Bad flags (the trainer's exit status 2): a restart would fail the same way.
        rc, out = run_launcher(["--num-ps", "1", "--num-workers", "1", "--base-port", "0",
                                "--bin-dir", BUILD_DIR, "--log-dir",
                                os.path.join(self.dir, "logs"), "--", "--no-such-flag", "1"])
        self.assertEqual(rc, 1, out)
        self.assertIn("worker 0 is not restarted: exit status 2 is the trainer's refusal of its "
                      "settings", out)
        self.assertNotRegex(out, r"restarted worker \d+ pid")
        # A server without a checkpoint folder: nothing to restore it from.
        bin_dir = make_stub_bin_dir(self.dir)
        r = Run(["--num-ps", "2", "--num-workers", "1", "--base-port", "0", "--bin-dir",
                 bin_dir, "--log-dir", os.path.join(self.dir, "logs2")])
        r.wait_for(r"\[worker 0\] stub trainer rank 0 pid")
        os.kill(r.pids()["ps 1"], signal.SIGKILL)
        self.assertEqual(r.finish(30), 1, r.output)
        self.assertRegex(r.output, r"FAILED: ps 1 \(pid \d+\) exited unexpectedly: killed by "
                                   r"SIGKILL\n")
        self.assertIn("cannot recover from the death of ps 1: a server's state comes back only "
                      "from a checkpoint, and there is no checkpoint folder (--checkpoint-dir "
                      "DIR)", r.output)
        self.assertNotRegex(r.output, r"restarted \w+ \d+ pid")
        self.assert_all_gone(r.output)


@unittest.skipUnless(os.access(PS_BIN, os.X_OK) and os.access(TRAINER_BIN, os.X_OK),
                     f"ferry-ps / ferry-trainer not built under {BUILD_DIR}")
class SlotMoveTest(unittest.TestCase):
    """Issue 38 (protocol 1.17, placement versions) with the real binaries under the launcher: a
    sync ctr job (Adam; dense tables in chunks of 256 on every server) of 3 servers and 2
    workers empties server 2 into the others while it trains
    (ferry-trainer --move-slots: worker 0 checkpoints and moves the slots between two barriers)
    and fills it again by the job's first map, and ends with the numbers of the same job whose
    slots never moved, to the last bit of the final test loss and AUC."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-slots-test-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def argv(self, name, extra, launcher=(), num_ps=3):
        return (["--num-ps", str(num_ps), "--num-workers", "2", "--base-port", "0", "--gpus-per-host", "0",
                 "--bin-dir", BUILD_DIR, "--log-dir", os.path.join(self.dir, name),
                 "--checkpoint-dir", os.path.join(self.dir, name + "-ckpt")] + list(launcher) + ["--",
                 "--model", "ctr", "--ctr-train", "3000", "--ctr-test", "500", "--steps", "30",
                 "--batch", "32", "--consistency", "sync", "--log-every", "10", "--blas-threads", "1",
                 "--optimizer", "adam", "--lr", "0.01", "--table", "ctr/*:chunk_elems=256",
                 "--metrics-out", os.path.join(self.dir, name + "-{rank}.jsonl")] + extra)

    def final(self, name, out):
        """Worker 0's final evaluation from --metrics-out (its last run's)."""
        with open(os.path.join(self.dir, name + "-0.jsonl")) as f:
            events = [json.loads(line) for line in f]
        ends = [e for e in events if e["event"] == "end"]
        self.assertEqual(len(ends), 1, out)
        return ends[0]["final"]

    def job(self, name, extra, num_ps=3):
        """Runs the job: (launcher output, worker 0's final evaluation)."""
        rc, out = run_launcher(self.argv(name, extra, num_ps=num_ps), timeout=180)
        self.assertEqual(rc, 0, out)
        self.assert_all_gone(out)
        return out, self.final(name, out)

    def test_a_server_emptied_and_filled_again_while_training_leaves_the_bits(self):
        out, moved = self.job("moved", ["--move-slots", "10:drain=2,20:first"])
        # The move's checkpoint is one as any other: the launcher can restart the job from it.
        self.assertRegex(out, r"(?m)^\[worker 0\] checkpoint of step 10 saved: ")
        self.assertRegex(out, r"(?m)^\[worker 0\] moved 1680 slots at step 10 \(server 2 drained\): "
                              r"placement version 2; checkpoint [\d.]+ s, hand-over [\d.]+ s$")
        self.assertRegex(out, r"(?m)^\[worker 0\] moved 1680 slots at step 20 \(the first map\): "
                              r"placement version 3; checkpoint [\d.]+ s, hand-over [\d.]+ s$")
        with open(os.path.join(self.dir, "moved", "ps-2.log")) as f:
            ps2 = f.read()
        gave = re.search(r"placement version 2 from the checkpoint of step 10: took 0 chunks and 0 "
                         r"rows, gave up (\d+) chunks and (\d+) rows", ps2)
        took = re.search(r"placement version 3 from the checkpoint of step 20: took (\d+) chunks "
                         r"and (\d+) rows, gave up 0 chunks and 0 rows", ps2)
        self.assertTrue(gave and took, ps2)
        # The dense chunks (with Adam's state) went and came back; the embeddings' rows too, with
        # those made since.
        self.assertGreater(int(gave.group(1)), 0, ps2)
        self.assertEqual(int(took.group(1)), int(gave.group(1)), ps2)
        self.assertGreater(int(gave.group(2)), 0, ps2)
        self.assertGreater(int(took.group(2)), int(gave.group(2)), ps2)
        _, still = self.job("still", [])
        self.assertEqual(moved, still)  # every number, as JSON writes a double: all its bits
        self.assertIn("auc", moved)

    def test_a_server_killed_in_a_move_leaves_the_bits(self):
        """Server 2 is killed with SIGKILL in the hand-over at step 10, once it has adopted the new
        map (the other servers may have or not): the launcher restarts every process from the
        newest checkpoint, the move's own (of step 10, written under the first map), whose map
        every server restores; the workers, resumed at step 10, skip that move, and the job ends
        with the bits of the job that never moved."""
        _, still = self.job("still", [])
        # (Worker 1 a straggler by 300 ms a step, so that the kill comes before the next checkpoint,
        # the move's at step 20; on a machine so loaded that it does not, the job restores that one
        # and skips that move instead, with the same bits.)
        out = self.kill_once("killed", ["--move-slots", "10:drain=2,20:first", "--straggler", "1:300ms"],
                             r"^\[ps 2\] ferry-ps 2: placement version 2 from the checkpoint of step 10: ", "ps 2")
        m = re.search(r"(?m)^ferry-launch: recovery 1 of at most \d+: ps 2 .* the job resumed at step (10|20), "
                      r"the step of the checkpoint restored", out)
        self.assertTrue(m, out)
        self.assertRegex(out, rf"(?m)^\[worker 0\] not moving slots at step {m.group(1)}: this worker was restarted "
                              r"at that step")
        self.assertEqual(self.final("killed", out), still)
        self.assert_all_gone(out)

    def test_a_drained_server_leaves_the_job_and_the_job_keeps_the_bits(self):
        """Issue 38, protocol 1.20: server 2, started with --exit-when-drained, is drained at step
        5; it leaves the job once every worker holds the new map (and 2 s more), and exits 0, which
        the launcher reports and does not restart. The checkpoints of steps 10 and 20 list its
        shard, which server 0 wrote, empty. Then, in a second run, ps 1 is killed with SIGKILL once
        server 2 has left and the checkpoint of step 20 is saved: the launcher restarts every
        process from it, and server 2, restored to a map that gives it no slot, leaves at once; the
        workers speak to servers 0 and 1 alone. Both runs end with the bits of the job whose server
        set never changed. (Worker 1 is a straggler by 300 ms a step, so that the job runs on for
        some seconds after the drain.)"""
        _, still = self.job("still", [])
        launcher = ["--checkpoint-every", "10", "--ps-arg=--exit-when-drained"]
        extra = ["--move-slots", "5:drain=2", "--straggler", "1:300ms"]
        rc, out = run_launcher(self.argv("left", extra, launcher), timeout=180)
        self.assertEqual(rc, 0, out)
        self.assert_all_gone(out)
        self.assertRegex(out, r"(?m)^\[ps 2\] ferry-ps 2: owns no slot of placement version 2 and no worker will "
                              r"send here again: left the job after [\d.]+ s \(every worker held the map after [\d.]+ s\)$")
        self.assertRegex(out, r"(?m)^ferry-launch: ps 2 left the job \(exit status 0: it owns no slot")
        for step in (10, 20):
            self.assertRegex(out, rf"(?m)^\[ps 0\] ferry-ps 0: checkpoint of step {step}: step-0+{step}-shard-00002-of-"
                                  r"00003\.ckpt, the shard of server 2, which owns no slot \(empty\)$")
            self.assertNotRegex(out, rf"(?m)^\[ps 2\] ferry-ps 2: checkpoint of step {step}")
        self.assertEqual(self.final("left", out), still)

        r = self.start("left-killed", extra, launcher)
        r.wait_for(r"^ferry-launch: ps 2 left the job ", 120)
        r.wait_for(r"^\[worker 0\] checkpoint of step 20 saved: ", 120)
        victim = r.pids()["ps 1"]
        os.kill(victim, signal.SIGKILL)
        rc = r.finish(180)
        out = r.output
        self.assertEqual(rc, 0, out)
        self.assertIn(f"ps 1 (pid {victim}) died (killed by SIGKILL)", out)
        self.assertRegex(out, r"(?m)^ferry-launch: recovery 1 of at most \d+: ps 1 .* the job resumed at step 20, "
                              r"the step of the checkpoint restored")
        # It left before the kill, and restored it leaves at once: during the rendezvous, or just
        # after it on a loaded machine.
        self.assertEqual(len(re.findall(r"(?m)^ferry-launch: ps 2 left the job (at its start )?\(exit status 0: ",
                                        out)), 2, out)
        self.assertRegex(out, r"(?m)^\[ps 2\] ferry-ps 2: owns no slot of placement version 2 \(restored\): ")
        self.assertEqual(self.final("left-killed", out), still)
        self.assert_all_gone(out)

    def test_a_job_grows_from_2_to_3_servers_and_back_to_2_and_keeps_the_bits(self):
        """Issue 38, protocol 1.20: the servers' first map gives slots to servers 0 and 1 of 3
        (ferry-ps --active-servers 2): no worker speaks to server 2 until worker 0 gives it a fair
        share at step 5 (--move-slots 5:join=2: it says Hello there, declares the tables, and
        server 2 takes its rows and chunks from the checkpoint of step 5); at step 12 it is
        drained, leaves the job and exits 0 (--exit-when-drained). The job ends with the bits of
        the job of 2 servers."""
        _, still = self.job("still-2", [], num_ps=2)
        launcher = ["--checkpoint-every", "10", "--ps-arg", "--exit-when-drained --active-servers 2"]
        rc, out = run_launcher(self.argv("grown", ["--move-slots", "5:join=2,12:drain=2", "--straggler", "1:300ms"],
                                         launcher), timeout=180)
        self.assertEqual(rc, 0, out)
        self.assert_all_gone(out)
        self.assertRegex(out, r"(?m)^\[ps 0\] ferry-ps 0: checkpoint of step 5: step-0+5-shard-00002-of-00003\.ckpt, "
                              r"the shard of server 2, which owns no slot \(empty\)$")
        self.assertRegex(out, r"(?m)^\[worker 0\] moved 1680 slots at step 5 \(server 2 joined\): placement version 2;")
        self.assertRegex(out, r"(?m)^\[worker 0\] moved 1680 slots at step 12 \(server 2 drained\): placement version 3;")
        with open(os.path.join(self.dir, "grown", "ps-2.log")) as f:
            ps2 = f.read()
        took = re.search(r"placement version 2 from the checkpoint of step 5: took (\d+) chunks and (\d+) rows, "
                         r"gave up 0 chunks and 0 rows", ps2)
        gave = re.search(r"placement version 3 from the checkpoint of step 12: took 0 chunks and 0 rows, gave up "
                         r"(\d+) chunks and (\d+) rows", ps2)
        self.assertTrue(took and gave, ps2)
        self.assertGreater(int(took.group(1)), 0, ps2)
        self.assertGreater(int(took.group(2)), 0, ps2)
        self.assertEqual(int(gave.group(1)), int(took.group(1)), ps2)
        self.assertGreaterEqual(int(gave.group(2)), int(took.group(2)), ps2)
        # While it owned slots it wrote its own shard (step 10), before and after none.
        self.assertNotRegex(ps2, r"ferry-ps 2: checkpoint of step 5: ")
        self.assertRegex(ps2, r"ferry-ps 2: checkpoint of step 10: step-0+10-shard-00002-of-00003\.ckpt \(full\)")
        self.assertNotRegex(ps2, r"ferry-ps 2: checkpoint of step 20: ")
        self.assertRegex(out, r"(?m)^ferry-launch: ps 2 left the job \(exit status 0: it owns no slot")
        self.assertEqual(self.final("grown", out), still)

    def test_moves_asked_while_the_job_runs_grow_and_shrink_it_and_keep_the_bits(self):
        """Issue 38, protocol 1.24: nothing in the job's flags says when to move. While it trains
        (worker 1 a straggler by 100 ms a step), ferry-move asks server 0 for server 2 to join; the
        workers take the ask at their next move check (--move-asks-every 5) and worker 0 makes
        it there as a --move-slots move; a second ask, once that one is made, drains server 2
        again and it leaves. The job ends with the bits of the job of 2 servers."""
        _, still = self.job("asked-still", ["--steps", "80"], num_ps=2)
        launcher = ["--checkpoint-every", "10", "--ps-arg", "--exit-when-drained --active-servers 2"]
        run = Run(self.argv("asked", ["--steps", "80", "--move-asks-every", "5", "--straggler", "1:100ms"],
                            launcher))
        try:
            run.wait_for(r"^\[worker 0\] step \d+/80", timeout=120)  # training
            server0 = listening(run.output)["ps 0"]
            move = [os.path.join(BUILD_DIR, "bin", "ferry-move"), "--server", server0]
            asked = subprocess.run(move + ["join=2"], capture_output=True, text=True, timeout=60)
            self.assertEqual(asked.returncode, 0, asked.stdout + asked.stderr)
            self.assertIn("server 0 keeps the ask (join 2)", asked.stdout)
            run.wait_for(r"^\[worker 0\] moved 1680 slots at step \d+ \(server 2 joined\)", timeout=120)
            asked = subprocess.run(move + ["drain=2"], capture_output=True, text=True, timeout=60)
            self.assertEqual(asked.returncode, 0, asked.stdout + asked.stderr)
            rc = run.finish(timeout=180)
        finally:
            run.kill_if_running()
        out = run.output
        self.assertEqual(rc, 0, out)
        self.assert_all_gone(out)
        joined = re.search(r"(?m)^\[worker 0\] moved 1680 slots at step (\d+) \(server 2 joined\): placement "
                           r"version 2;", out)
        drained = re.search(r"(?m)^\[worker 0\] moved 1680 slots at step (\d+) \(server 2 drained\): placement "
                            r"version 3;", out)
        self.assertTrue(joined and drained, out)
        self.assertLess(int(joined.group(1)), int(drained.group(1)), out)
        self.assertRegex(out, r"(?m)^\[ps 0\] ferry-ps 0: handed the move asked \(server 2 to join\) to the 2 workers")
        self.assertRegex(out, r"(?m)^\[ps 0\] ferry-ps 0: handed the move asked \(server 2 to leave \(drained\)\) "
                              r"to the 2 workers")
        self.assertRegex(out, r"(?m)^ferry-launch: ps 2 left the job \(exit status 0: it owns no slot")
        self.assertEqual(self.final("asked", out), still)

    def test_a_move_read_ahead_leaves_the_bits(self):
        """With a checkpoint every 10 steps, each but the first after a move a delta
        (--checkpoint-deltas), worker 0 asks the servers to read the checkpoint of steps 10 and
        20 ahead for the moves at steps 19 and 29 (protocol 1.19) while the job trains (worker 1
        is a straggler by 200 ms a step, so the checkpoint is committed well before the move),
        and each move's hand-over starts from what they read: the job ends with the bits of the
        job that never moved."""
        launcher = ["--checkpoint-every", "10", "--ps-arg", "--checkpoint-deltas 4 --checkpoint-delta-share 100"]
        rc, out = run_launcher(self.argv("ahead", ["--move-slots", "19:drain=2,29:first", "--straggler", "1:200ms"],
                                         launcher), timeout=180)
        self.assertEqual(rc, 0, out)
        self.assert_all_gone(out)
        for step, what, base in ((19, "server 2 drained", 10), (29, "the first map", 20)):
            self.assertRegex(out, rf"(?m)^\[worker 0\] moved 1680 slots at step {step} \({what}\): placement "
                                  rf"version \d; checkpoint [\d.]+ s, hand-over [\d.]+ s \(the servers had read the "
                                  rf"checkpoint of step {base} ahead\)$")
        self.assertNotIn("could not read the checkpoint", out)
        with open(os.path.join(self.dir, "ahead", "ps-2.log")) as f:
            ps2 = f.read()
        for version, step in ((2, 19), (3, 29)):
            self.assertRegex(ps2, rf"placement version {version} from the checkpoint of step {step}: .*; [1-9]\d* "
                                  r"shard chain\(s\) started from the read ahead")
        self.assertRegex(ps2, r"placement version 3 from the checkpoint of step 29: took [1-9]\d* chunks")
        _, still = self.job("still", [])
        self.assertEqual(self.final("ahead", out), still)

    assert_all_gone = RecoveryTest.assert_all_gone

    def start(self, name, extra, launcher=()):
        r = Run(self.argv(name, extra, launcher))
        self.addCleanup(lambda: r.proc.poll() is None and r.proc.kill())
        return r

    def kill_once(self, name, extra, line, who, launcher=()):
        """Runs the job, kills `who` ("ps 2", "worker 1") with SIGKILL once the launcher's output
        has `line`, and checks that the job ends well: the launcher's output."""
        r = self.start(name, extra, launcher)
        r.wait_for(line, 120)
        victim = r.pids()[who]
        os.kill(victim, signal.SIGKILL)
        rc = r.finish(180)
        out = r.output
        self.assertEqual(rc, 0, out)
        self.assertIn(f"{who} (pid {victim}) died (killed by SIGKILL)", out)
        return out

    def test_a_worker_killed_at_a_move_leaves_the_bits(self):
        """Worker 1 is killed with SIGKILL at the move's step, two ways; the job ends with the
        numbers of the job that never moved either way.
        - At the move's barrier: worker 0 is stopped (SIGSTOP) once it has pushed step 9, while
          it waits for step 10's pull (worker 1 is a straggler by 700 ms a step); worker 1 is
          killed once it has pushed step 9 too. Restarted, worker 1 resumes at step 10 and skips
          the move; worker 0, let go, finds the barrier it enters cannot complete, is refused,
          restarted at step 10 and skips it too.
        - Before the move: worker 0 (the straggler) has not pushed step 9 yet, so the restarted
          worker 1 redoes step 9 and takes part in the move (on a loaded machine it may resume
          at step 10 and skip it instead)."""
        _, still = self.job("still", [])
        # In the barrier.
        # The launcher leaves the stopped worker 0 alone (its default kills a process stopped
        # for 2 s, which a loaded machine can reach before worker 1's restart), and the servers
        # wait for it as long as the test may take (their default gives up after 10 s).
        r = self.start("in-barrier", ["--move-slots", "10:drain=2", "--straggler", "1:700ms"],
                       ["--kill-stopped-after", "0", "--ps-arg", "--worker-timeout-s 300"])
        r.wait_for(r"^\[worker 0\] step 10/30 ", 60)
        worker0 = r.pids()["worker 0"]
        os.kill(worker0, signal.SIGSTOP)
        try:
            r.wait_for(r"^\[worker 1\] step 10/30 ", 60)  # it pushed step 9
            victim = r.pids()["worker 1"]
            os.kill(victim, signal.SIGKILL)
            r.wait_for(r"^\[worker 1\] not moving slots at step 10: this worker was restarted at that step", 60)
        finally:
            with contextlib.suppress(ProcessLookupError):  # keep a failed wait's message
                os.kill(worker0, signal.SIGCONT)
        rc = r.finish(180)
        out = r.output
        self.assertEqual(rc, 0, out)
        self.assertIn(f"worker 1 (pid {victim}) died (killed by SIGKILL)", out)
        self.assertRegex(out, r"(?m)^\[worker 1\] resuming the job at step 10 of 30")
        self.assertNotRegex(out, r"(?m)^\[worker 0\] moved \d+ slots")
        self.assertEqual(self.final("in-barrier", out), still)
        self.assert_all_gone(out)
        # Before the move.
        out = self.kill_once("before", ["--move-slots", "10:drain=2", "--straggler", "0:300ms"],
                             r"^\[worker 1\] step 10/30 ", "worker 1")
        self.assertTrue(re.search(r"(?m)^\[worker 0\] moved 1680 slots at step 10 ", out) or
                        re.search(r"(?m)^\[worker 1\] not moving slots at step 10: this worker was "
                                  r"restarted at that step", out), out)
        self.assertEqual(self.final("before", out), still)
        self.assert_all_gone(out)


def kill_ps_1_once_saved(test, argv, step):
    """Runs a launcher job of 40 steps (argv), kills ps 1 with SIGKILL once worker 0 has saved the
    checkpoint of `step`, and checks that the job ends well: (output, the step worker 2 resumed at)."""
    r = Run(argv)
    test.addCleanup(lambda: r.proc.poll() is None and r.proc.kill())
    r.wait_for(rf"^\[worker 0\] checkpoint of step {step} saved", 120)
    victim = r.pids()["ps 1"]
    os.kill(victim, signal.SIGKILL)
    rc = r.finish(180)
    out = r.output
    test.assertEqual(rc, 0, out)
    test.assertIn(f"ps 1 (pid {victim}) died (killed by SIGKILL)", out)
    m = re.search(r"(?m)^\[worker 2\] resuming the job at step (\d+) of 40", out)
    test.assertTrue(m, out)
    return out, int(m.group(1))


class WorkerLeaveTest(unittest.TestCase):
    """Issue 38 (protocol 1.18, a worker leaving a job in progress) with the real binaries under
    the launcher: a sync ctr job of 2 servers and 3 workers in which worker 2, a straggler by
    1 s a step, leaves before step 10 (ferry-trainer --leave 2@10). The other two are waited for
    by nothing from then on, read its share of every step's examples between them, and a server
    killed later restarts every process from a checkpoint, worker 2 too, which leaves again at
    once: the job ends with the uninterrupted run's numbers, to the last bit (a straggler's delay
    changes when, not what)."""

    STEP_EXAMPLES = 32

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-leave-test-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def argv(self, name, straggler="2:1000ms", leave=("--leave", "2@10")):
        return (["--num-ps", "2", "--num-workers", "3", "--base-port", "0", "--gpus-per-host", "0",
                 "--bin-dir", BUILD_DIR, "--log-dir", os.path.join(self.dir, name),
                 "--checkpoint-dir", os.path.join(self.dir, name + "-ckpt"), "--checkpoint-every", "5",
                 "--", "--model", "ctr", "--ctr-train", "3000", "--ctr-test", "500", "--steps", "40",
                 "--batch", str(self.STEP_EXAMPLES), "--consistency", "sync", "--log-every", "5",
                 "--eval-every", "15", "--blas-threads", "1", "--optimizer", "adam", "--lr", "0.01",
                 "--straggler", straggler, *leave,
                 "--metrics-out", os.path.join(self.dir, name + "-{rank}.jsonl")])

    def events(self, name, rank):
        with open(os.path.join(self.dir, f"{name}-{rank}.jsonl")) as f:
            return [json.loads(line) for line in f]

    assert_all_gone = RecoveryTest.assert_all_gone

    def test_a_worker_that_leaves_is_waited_for_by_no_one_and_its_examples_are_read_by_the_others(self):
        r = Run(self.argv("left"))
        self.addCleanup(lambda: r.proc.poll() is None and r.proc.kill())
        rc = r.finish(180)
        out = r.output
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"(?m)^\[worker 2\] left the job before step 10 \(--leave\): the other "
                              r"workers train on without it$")
        self.assertIn("ferry-launch: worker 2 finished (exit status 0)", out)
        self.assert_all_gone(out)
        # 1000 examples a shard, 32 steps an epoch (the last reads the shard's 8 left). Steps 0-9
        # read 32 examples on each worker; from step 10 on, workers 0 and 1 each read their own
        # 32 and 16 of worker 2's, and at step 31 (epoch 0's last) 8 and 4; epoch 1 as before.
        ends = {rank: [e for e in self.events("left", rank) if e["event"] == "end"] for rank in (0, 1, 2)}
        for rank in (0, 1):
            self.assertEqual(len(ends[rank]), 1, out)
            self.assertEqual(ends[rank][0]["examples"], 10 * 32 + 21 * 48 + 12 + 8 * 48, out)
        self.assertEqual(len(ends[2]), 1, out)
        self.assertEqual((ends[2][0]["left_at"], ends[2][0]["examples"]), (10, 10 * 32), out)
        # Not waited for: worker 2 slept 1 s in each of its steps; had the others waited for it
        # after it left, their last 20 steps would have taken 20 s or more.
        train = {e["step"]: e["wall_s"] for e in self.events("left", 0) if e["event"] == "train"}
        self.assertLess(train[30] - train[10], 10.0, out)
        self.assertRegex(out, r"(?m)^\[worker 0\] step 40/40 epoch 2/2: ")
        # The merged evaluation of step 15 is the two workers' (500 examples).
        self.assertRegex(out, r"(?m)^\[worker 0\] eval  step 15: .*\(500 examples\)$")
        want = ends[0][0]["final"]
        self.assertIn("auc", want)

        # Again, with ps 1 killed once step 15's checkpoint is saved: every process restarts from
        # a checkpoint of step 15 or later, worker 2 leaves at once, and the numbers are the same.
        # (Worker 1 is the straggler here, by 200 ms a step: the job is still running then.)
        out, resumed = kill_ps_1_once_saved(self, self.argv("killed", straggler="1:200ms"), 15)
        self.assertGreaterEqual(resumed, 15, out)
        self.assertRegex(out, rf"(?m)^\[worker 2\] left the job before step {resumed} \(--leave\)")
        got = [e for e in self.events("killed", 0) if e["event"] == "end"]
        self.assertEqual(got[-1]["final"], want)  # every number, as JSON writes a double: all its bits
        self.assert_all_gone(out)


    def test_a_worker_asked_to_leave_while_the_job_runs_leaves_at_the_next_check(self):
        """Protocol 1.26: nothing in the job's flags says worker 2 leaves. While the job trains
        (worker 2 a straggler by 300 ms a step), ferry-move asks server 0 for worker 2's leave;
        every worker takes the ask at the next check (--move-asks-every 5, step T), worker 2
        trains step T and exits 0, and the other two read its share of every step's examples
        from T + 1 on (so each example is still read once an epoch)."""
        r = Run(self.argv("asked", straggler="2:300ms", leave=("--move-asks-every", "5")))
        try:
            r.wait_for(r"^\[worker 0\] step \d+/40", timeout=120)  # training
            move = [os.path.join(BUILD_DIR, "bin", "ferry-move"), "--server", listening(r.output)["ps 0"]]
            asked = subprocess.run(move + ["leave-worker=2"], capture_output=True, text=True, timeout=60)
            self.assertEqual(asked.returncode, 0, asked.stdout + asked.stderr)
            self.assertIn("server 0 keeps the ask (leave-worker 2)", asked.stdout)
            rc = r.finish(180)
        finally:
            r.kill_if_running()
        out = r.output
        self.assertEqual(rc, 0, out)
        left = re.search(r"(?m)^\[worker 2\] left the job before step (\d+) \(asked while the job ran\): the "
                         r"other workers train on without it$", out)
        self.assertTrue(left, out)
        at = int(left.group(1))
        self.assertEqual(at % 5, 1, out)  # after a check step
        for rank in (0, 1):
            self.assertRegex(out, rf"(?m)^\[worker {rank}\] worker 2 leaves the job before step {at} \(asked of "
                                  r"server 0\): the others read its share of each step's examples$")
        self.assertIn("ferry-launch: worker 2 finished (exit status 0)", out)
        self.assert_all_gone(out)
        # 32 examples a step each (epoch 0's last, step 31, reads the shard's 8 left); with worker
        # 2 gone, workers 0 and 1 each read 16 of its 32 more (4 of its 8).
        def read(step, absent):
            return (8 if step == 31 else 32) * (3 if absent else 2) // 2
        want = sum(read(s, s >= at) for s in range(40))
        for rank in (0, 1):
            ends = [e for e in self.events("asked", rank) if e["event"] == "end"]
            self.assertEqual([e["examples"] for e in ends], [want], out)
        ends = [e for e in self.events("asked", 2) if e["event"] == "end"]
        self.assertEqual([(e["left_at"], e["examples"]) for e in ends], [(at, sum(read(s, False) for s in range(at)))],
                         out)

    def test_a_worker_that_left_joins_again_while_the_job_runs(self):
        """Protocol 1.27: worker 2's leave is asked (ferry-move), it leaves after a check step and
        exits 0; then a new ferry-trainer process of it, started by hand with the job's flags and
        --resume --rejoin, asks server 0 to take it back, and joins at the step after the next
        check (--move-asks-every 5): from there it trains, and the other two read its share no
        more, so each example is still read once an epoch. Worker 1 straggles by 500 ms a step, so
        that the job is still running when the new process comes (each step left takes 0.5 s)."""
        r = Run(self.argv("rejoin", straggler="1:500ms", leave=("--move-asks-every", "5")))
        back = None
        try:
            r.wait_for(r"^\[worker 0\] step \d+/40", timeout=120)  # training
            ends = listening(r.output)
            move = [os.path.join(BUILD_DIR, "bin", "ferry-move"), "--server", ends["ps 0"]]
            asked = subprocess.run(move + ["leave-worker=2"], capture_output=True, text=True, timeout=60)
            self.assertEqual(asked.returncode, 0, asked.stdout + asked.stderr)
            r.wait_for(r"ferry-launch: worker 2 finished \(exit status 0\)", timeout=120)
            argv = self.argv("rejoin", straggler="1:500ms", leave=("--move-asks-every", "5"))
            trainer = argv[argv.index("--") + 1:]
            trainer[trainer.index("--metrics-out") + 1] = os.path.join(self.dir, "rejoin-back.jsonl")
            back = subprocess.Popen([os.path.join(BUILD_DIR, "bin", "ferry-trainer"), "--servers",
                                     ",".join(ends[f"ps {i}"] for i in range(2)), "--rank", "2", "--num-workers", "3",
                                     "--checkpoint-every", "5", "--incarnation", "1", "--resume", "--rejoin", *trainer],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            said, _ = back.communicate(timeout=180)
            self.assertEqual(back.returncode, 0, said)
            rc = r.finish(180)
        finally:
            r.kill_if_running()
            if back is not None and back.poll() is None:
                back.kill()
                back.wait()
        out = r.output
        self.assertEqual(rc, 0, out)
        at = int(re.search(r"(?m)^\[worker 2\] left the job before step (\d+) \(asked while the job ran\)", out)
                 .group(1))
        joined = re.search(r"(?m)^\[worker 2\] joins the job again at step (\d+) \(handed at the move check of "
                           r"step \d+\)$", said)
        self.assertTrue(joined, said)
        again = int(joined.group(1))
        self.assertEqual((at % 5, again % 5), (1, 1), out + said)
        self.assertGreater(again, at)
        for rank in (0, 1):
            self.assertRegex(out, rf"(?m)^\[worker {rank}\] worker 2 joins the job again at step {again} \(asked "
                                  r"of server 0\)")
        self.assert_all_gone(out)
        def read(step, absent):  # as in the leave test above
            return (8 if step == 31 else 32) * (3 if absent else 2) // 2
        want = sum(read(s, at <= s < again) for s in range(40))
        for rank in (0, 1):
            ends = [e for e in self.events("rejoin", rank) if e["event"] == "end"]
            self.assertEqual([e["examples"] for e in ends], [want], out)
        ends = [e for e in self.events("rejoin", "back") if e["event"] == "end"]
        self.assertEqual([(e["first_step"], e["examples"]) for e in ends],
                         [(again, sum(read(s, False) for s in range(again, 40)))], said)


class WorkerJoinTest(unittest.TestCase):
    """Issue 38 (protocol 1.18, a worker joining a job in progress) with the real binaries under
    the launcher: a sync ctr job of 2 servers and 3 workers in which worker 2 takes part from step
    25 (ferry-trainer --join 2@25, the evaluation's step: no collective before it to keep it in
    step) and worker 1 leaves before step 30. Each step's examples are those of the job where all three train
    throughout (the workers present split an absent one's share), so the two learn the same
    model but for float rounding. Then with the servers holding a pull at most 5 s and worker 0 a
    straggler (the joiner must follow the job step by step, or its wait for step 25 would
    expire), and a server killed before the join: every process restarts from a checkpoint, and
    the job ends with the bits of the same job uninterrupted."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-join-test-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def argv(self, name, extra):
        return (["--num-ps", "2", "--num-workers", "3", "--base-port", "0", "--gpus-per-host", "0",
                 "--bin-dir", BUILD_DIR, "--log-dir", os.path.join(self.dir, name),
                 "--checkpoint-dir", os.path.join(self.dir, name + "-ckpt"), "--checkpoint-every", "5",
                 "--", "--model", "ctr", "--ctr-train", "3000", "--ctr-test", "500", "--steps", "40",
                 "--batch", "32", "--consistency", "sync", "--log-every", "5", "--eval-every", "25",
                 "--blas-threads", "1", "--optimizer", "adam", "--lr", "0.01",
                 "--metrics-out", os.path.join(self.dir, name + "-{rank}.jsonl")] + extra)

    def ends(self, name):
        out = {}
        for rank in range(3):
            with open(os.path.join(self.dir, f"{name}-{rank}.jsonl")) as f:
                out[rank] = [e for e in (json.loads(line) for line in f) if e["event"] == "end"][-1]
        return out

    def job(self, name, extra):
        r = Run(self.argv(name, extra))
        self.addCleanup(lambda: r.proc.poll() is None and r.proc.kill())
        rc = r.finish(180)
        self.assertEqual(rc, 0, r.output)
        RecoveryTest.assert_all_gone(self, r.output)
        return r.output, self.ends(name)

    def test_a_worker_that_joins_contributes_from_its_first_step(self):
        membership = ["--join", "2@25", "--leave", "1@30"]
        out, ends = self.job("joined", membership)
        self.assertRegex(out, r"(?m)^\[worker 2\] joins the job at step 25 \(--join\)$")
        self.assertRegex(out, r"(?m)^\[worker 1\] left the job before step 30 \(--leave\)")
        # 32 steps an epoch of 32 examples a worker (the last: the shard's 8 left). Worker 0 reads
        # 48 a step while one of the three is absent (12 at step 31), 32 while all take part.
        self.assertEqual(ends[0]["examples"], 25 * 48 + 5 * 32 + 48 + 12 + 8 * 48, out)
        self.assertEqual(ends[1]["examples"], 25 * 48 + 5 * 32, out)
        self.assertEqual(ends[1]["left_at"], 30, out)
        self.assertEqual(ends[2]["examples"], 5 * 32 + 48 + 12 + 8 * 48, out)
        # Worker 2 contributed to every step from its first: one push a step, none late.
        self.assertEqual((ends[2]["steps"], ends[2]["pushes_used"], ends[2]["pushes_dropped"]), (15, 15, 0), out)
        self.assertEqual(ends[0]["pushes_used"], 40, out)
        joined = ends[0]["final"]
        _, plain = self.job("plain", [])
        for key in ("loss", "log_loss", "auc", "accuracy"):  # the same examples each step
            self.assertAlmostEqual(joined[key], plain[0]["final"][key], delta=1e-6 * max(1.0, abs(joined[key])),
                                   msg=f"{key}: {joined} against {plain[0]['final']}")

        # Servers that hold a pull at most 5 s, worker 0 a straggler by 400 ms a step (6 s or
        # more from a restart to step 25), and ps 1 killed after step 5's checkpoint, before
        # worker 2 joins: every process restarts from it, worker 2 follows the job to step 25
        # again and joins, and the job ends with the bits of the run above.
        argv = self.argv("killed", membership + ["--straggler", "0:400ms"])
        argv[argv.index("--"):argv.index("--")] = ["--ps-arg", "--max-wait-s 5"]
        out, resumed = kill_ps_1_once_saved(self, argv, 5)
        self.assertLessEqual(resumed, 10, out)  # so the run-up to step 25 is 6 s or more
        # Only the server's death restarted anything: no worker failed waiting.
        self.assertIn("recovery summary: 1 restart of at most 3 (0 after a worker died, 1 after a server died)", out)
        self.assertEqual(self.ends("killed")[0]["final"], joined)  # every number, all its bits
        self.assertEqual(self.ends("killed")[2]["pushes_dropped"], 0, out)
        RecoveryTest.assert_all_gone(self, out)


class CheckpointFlagsTest(unittest.TestCase):
    """--checkpoint-dir, --checkpoint-every, --resume, --max-restarts: usage errors, the
    preflight of the checkpoint folder, and what --dry-run prints. Nothing is started."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-launch-test-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    BASE = ["--num-ps", "2", "--num-workers", "2", "--base-port", "0", "--gpus-per-host", "0",
            "--bin-dir", BUILD_DIR]
    DRY = ["--num-ps", "2", "--num-workers", "2", "--base-port", "7470", "--gpus-per-host", "0",
           "--bin-dir", BUILD_DIR, "--dry-run"]

    def checkpoint(self, folder, step, shard_bytes=4, current=True):
        """A fake checkpoint of one shard (names, sizes and the file's CRC-32 right; the launcher
        reads no more). The manifest says 4 bytes of b"x"; `shard_bytes` makes the file differ."""
        os.makedirs(folder, exist_ok=True)
        shard = f"step-{step:020d}-shard-00000-of-00001.ckpt"
        with open(os.path.join(folder, shard), "wb") as f:
            f.write(b"x" * shard_bytes)
        manifest = f"MANIFEST-{step:020d}"
        with open(os.path.join(folder, manifest), "w") as f:
            json.dump({"format": 1, "step": step, "meaning": "sync", "shards": [
                {"file": shard, "bytes": 4, "crc32": zlib.crc32(b"xxxx")}]}, f)
        if current:
            with open(os.path.join(folder, "CURRENT"), "w") as f:
                f.write(manifest + "\n")
        return manifest

    def test_usage_errors(self):
        folder = os.path.join(self.dir, "ckpt")
        cases = [
            (["--checkpoint-every", "20"], "argument --checkpoint-every: needs a checkpoint "
                                           "folder: give --checkpoint-dir DIR (or --resume DIR)"),
            (["--checkpoint-dir", folder, "--checkpoint-every", "0"],
             "argument --checkpoint-every: want an integer >= 1, got '0'"),
            (["--max-restarts", "-1"], "argument --max-restarts: want an integer >= 0, got '-1'"),
            (["--resume", folder, "--checkpoint-dir", folder],
             "--resume DIR and --checkpoint-dir are exclusive"),
            (["--resume", ""], "argument --resume: empty folder name"),
            (["--checkpoint-dir", folder, "--", "--resume"],
             "trainer flag --resume is set by the launcher; remove it (use --resume DIR)"),
            (["--checkpoint-dir", folder, "--", "--checkpoint-every=5"],
             "trainer flag --checkpoint-every=5 is set by the launcher; remove it (use "
             "--checkpoint-every)"),
            (["--checkpoint-dir", folder, "--ps-arg=--restore"],
             "--ps-arg flag --restore is set by the launcher; remove it (use --resume DIR)"),
            (["--ps-arg", "--checkpoint-dir /x"],
             "--ps-arg flag --checkpoint-dir is set by the launcher; remove it (use "
             "--checkpoint-dir)"),
        ]
        for extra, want in cases:
            with self.subTest(extra=extra):
                rc, out = run_in_process(self.BASE + ["--dry-run"] + extra)
                self.assertEqual(rc, 2, out)
                self.assertIn(want, out)
        self.assertFalse(os.path.exists(folder))

    def test_resume_needs_a_checkpoint(self):
        empty = os.path.join(self.dir, "empty")
        os.makedirs(empty)
        junk = os.path.join(self.dir, "junk")
        os.makedirs(junk)
        open(os.path.join(junk, "notes.txt"), "w").close()
        broken = os.path.join(self.dir, "broken")
        manifest = self.checkpoint(broken, 40)
        os.remove(os.path.join(broken, "step-00000000000000000040-shard-00000-of-00001.ckpt"))
        for folder, want in [
                (empty, "no checkpoint to resume from: the folder is empty"),
                (junk, "no checkpoint to resume from: it holds 1 entry (notes.txt) but no "
                       "CURRENT and no MANIFEST-<step> file"),
                (broken, f"no checkpoint to resume from: {manifest}: shard file "
                         "step-00000000000000000040-shard-00000-of-00001.ckpt is missing"),
                (os.path.join(self.dir, "nowhere"), "no such folder")]:
            with self.subTest(folder=folder):
                rc, out = run_in_process(self.BASE + ["--resume", folder, "--log-dir",
                                                      os.path.join(self.dir, "logs")])
                self.assertEqual(rc, 2, out)
                self.assertIn(f"ferry-launch: error: --resume {folder}: {want}", out)
                self.assertNotRegex(out, r"started \w+ \d+ pid")
        self.assertFalse(os.path.exists(os.path.join(self.dir, "logs")))

    def test_checkpoint_folder_preflight(self):
        fl = load_launcher_module().checkpoints
        # --resume: CURRENT first, then the newest other manifest that is whole.
        folder = os.path.join(self.dir, "ckpt")
        self.checkpoint(folder, 20)
        self.checkpoint(folder, 40, shard_bytes=3)  # CURRENT names it; its shard is short
        self.assertEqual(fl.find_checkpoint(folder), (
            "MANIFEST-00000000000000000020", 20,
            ["MANIFEST-00000000000000000040: shard file "
             "step-00000000000000000040-shard-00000-of-00001.ckpt has 3 bytes, the manifest "
             "says 4"]))
        # A byte changed, the size the same: the CRC-32 catches it, as the servers' check would
        # (the launcher checked only sizes: issue 35). Each byte in turn.
        for at in range(4):
            with self.subTest(byte=at):
                self.checkpoint(folder, 40)
                path = os.path.join(folder, "step-00000000000000000040-shard-00000-of-00001.ckpt")
                with open(path, "r+b") as f:
                    f.seek(at)
                    f.write(b"y")
                self.assertEqual(fl.find_checkpoint(folder), (
                    "MANIFEST-00000000000000000020", 20,
                    ["MANIFEST-00000000000000000040: shard file "
                     "step-00000000000000000040-shard-00000-of-00001.ckpt is damaged: its CRC-32 is "
                     f"{zlib.crc32(b'x' * at + b'y' + b'x' * (3 - at))}, the manifest says {zlib.crc32(b'xxxx')}"]))
        # A delta (format 2) needs its chain: a missing or damaged base file passes it over.
        self.checkpoint(folder, 60)
        with open(os.path.join(folder, "MANIFEST-00000000000000000060"), "w") as f:
            json.dump({"format": 2, "step": 60, "meaning": "sync", "shards": [
                {"file": "step-00000000000000000060-shard-00000-of-00001.ckpt", "bytes": 4,
                 "crc32": zlib.crc32(b"xxxx"), "base": [
                     {"file": "step-00000000000000000020-shard-00000-of-00001.ckpt", "bytes": 4,
                      "crc32": zlib.crc32(b"xxxx")},
                     {"file": "step-00000000000000000050-shard-00000-of-00001.ckpt", "bytes": 4,
                      "crc32": zlib.crc32(b"xxxx")}]}]}, f)
        self.assertEqual(fl.find_checkpoint(folder)[2][0],
                         "MANIFEST-00000000000000000060: shard file "
                         "step-00000000000000000050-shard-00000-of-00001.ckpt is missing")
        with open(os.path.join(folder, "step-00000000000000000050-shard-00000-of-00001.ckpt"),
                  "wb") as f:
            f.write(b"xxxx")
        self.assertEqual(fl.find_checkpoint(folder), ("MANIFEST-00000000000000000060", 60, []))
        self.checkpoint(folder, 40, shard_bytes=3)
        os.remove(os.path.join(folder, "MANIFEST-00000000000000000060"))
        # --checkpoint-dir: a folder that holds a checkpoint belongs to another job.
        rc, out = run_in_process(self.BASE + ["--checkpoint-dir", folder, "--log-dir",
                                              os.path.join(self.dir, "logs")])
        self.assertEqual(rc, 2, out)
        self.assertIn(f"--checkpoint-dir {folder} already holds a checkpoint (CURRENT names "
                      f"MANIFEST-00000000000000000040): --resume {folder} continues that job", out)

    def test_dry_run_shows_the_checkpoint_flags(self):
        folder = os.path.join(self.dir, "ckpt")
        rc, out = run_in_process(self.DRY + ["--checkpoint-dir", "rel/ckpt",
                                             "--checkpoint-every", "20", "--", "--steps", "5"])
        self.assertEqual(rc, 0, out)
        cmds = command_lines(out)
        absolute = os.path.abspath("rel/ckpt")
        self.assertTrue(cmds["ps 1"].endswith(f"--num-servers 2 --compute-threads 1 "
                                              f"--metrics 127.0.0.1:0 --num-workers 2 --checkpoint-dir {absolute}"),
                        cmds["ps 1"])
        self.assertTrue(cmds["worker 1"].endswith("--num-workers 2 --metrics 127.0.0.1:0 --checkpoint-every 20 "
                                                  "--steps 5"), cmds["worker 1"])
        self.assertIn("ferry-launch: up to 3 restarts (--max-restarts): a dead worker restarts "
                      "alone with --resume; a dead server: all processes restart, servers with "
                      "--restore (from the newest checkpoint), workers with --resume", out)
        rc, out = run_in_process(self.DRY + ["--resume", folder, "--max-restarts", "0",
                                             "--ps-arg", "--max-wait-s 30"])
        self.assertEqual(rc, 0, out)
        cmds = command_lines(out)
        self.assertTrue(cmds["ps 0"].endswith(f"--checkpoint-dir {folder} --restore "
                                              "--max-wait-s 30"), cmds["ps 0"])
        self.assertTrue(cmds["worker 0"].endswith("--num-workers 2 --metrics 127.0.0.1:0 --resume"), cmds["worker 0"])
        self.assertIn("--max-restarts 0: the first process that dies stops everything", out)
        self.assertFalse(os.path.exists(folder))  # a dry run checks and creates nothing


class JobProgressTest(unittest.TestCase):
    def test_the_slowest_worker_moves_the_job_line(self):
        load_launcher_module()
        from ferry_launch.progress import JobProgress
        lines, now = [], [100.0]

        class Sink:
            def line(self, text, err=False):
                lines.append(text)

        p = JobProgress(Sink(), 2, clock=lambda: now[0])
        p.line("[worker 0] step 10/100 k 1 loss 0.5  2000 examples/s")
        p.line("[ps 0] a server line")                   # passes through
        p.line("[worker 0] step 20/100 loss 0.25  2000 examples/s")
        self.assertEqual(lines, ["[ps 0] a server line"])  # worker 1 has not reported yet
        p.line("[worker 1] step 10/100 loss 0.75 1000 examples/s")
        self.assertEqual(lines[-1], "[job] step 10/100 (workers at 10-20): 3000 examples/s in all, "
                                    "mean loss 0.5000")
        now[0] = 110.0
        p.line("[worker 1] step 20/100 loss 0.25 1000 examples/s ETA 1m")
        self.assertEqual(lines[-1], "[job] step 20/100 (workers at 20): 3000 examples/s in all, "
                                    "mean loss 0.2500, ETA 1m20s")  # 10 steps in 10 s, 80 to go
        p.line("[worker 1] step 20/100 loss 0.25")     # the slowest did not move: no line
        self.assertEqual(len(lines), 3)


class RecoveryAccountingTest(unittest.TestCase):
    """The steps a recovery lost, from the workers' lines (no processes)."""

    def setUp(self):
        load_launcher_module()
        from ferry_launch.recovery import JobWatch, Recovery, summary
        self.JobWatch, self.Recovery, self.summary = JobWatch, Recovery, summary

    def test_async_workers_each_lose_their_own_steps(self):
        # Worker 0 was at 180 and worker 1 at 1500 when a server died; the checkpoint had
        # worker 0 at 100 and worker 1 at 1230. Before, this read "steps lost: 1400" (worker 1's
        # step less worker 0's checkpoint step).
        r = self.Recovery(1, "server", "ps 0 (pid 7)", "killed by SIGKILL", "everything", 10.0,
                          {"worker 0": 180, "worker 1": 1500}, ["worker 0", "worker 1"])
        self.assertFalse(r.resumed("worker 1", 1230, 11.0, own=True))
        self.assertTrue(r.resumed("worker 0", 100, 12.5, own=True))
        self.assertEqual(r.lost, 80 + 270)
        line = r.report(3)
        self.assertIn("steps lost: 350, of the workers' own steps (each worker's last step reported "
                      "before the death -> the step it resumed at: worker 0 180 -> 100, worker 1 "
                      "1500 -> 1230)", line)
        self.assertIn("each worker resumed at its own step in the checkpoint restored (the lowest: 100)",
                      line)
        self.assertIn("recovery time 2.50 s", line)
        self.assertIn("steps lost: 350 (async/ssp: in the workers' own steps)", self.summary([r], 3))

    def test_sync_workers_lose_the_global_steps_since_the_checkpoint(self):
        r = self.Recovery(1, "server", "ps 1", "killed by SIGKILL", "everything", 0.0,
                          {"worker 0": 70, "worker 1": 69}, ["worker 0", "worker 1"])
        r.resumed("worker 0", 60, 1.0)
        r.resumed("worker 1", 60, 1.0)
        self.assertEqual(r.lost, 10)
        self.assertIn("the job resumed at step 60, the step of the checkpoint restored; steps lost: 10 "
                      "(last step a worker reported before the death: 70)", r.report(3))
        alone = self.Recovery(2, "worker", "worker 1", "killed by SIGKILL", "worker 1", 0.0,
                              {"worker 1": 50}, ["worker 1"])
        alone.resumed("worker 1", 53, 0.5)
        self.assertEqual(alone.lost, 0)  # it rejoined at the global step

    def test_a_recovery_cut_short_is_counted_by_the_next(self):
        # A server died, and another before any worker said where it resumed: the first
        # recovery's loss was dropped ("steps lost: 0 ... 1 not complete").
        first = self.Recovery(1, "server", "ps 0", "killed by SIGKILL", "everything", 0.0,
                              {"worker 0": 220, "worker 1": 960}, ["worker 0", "worker 1"])
        second = self.Recovery(2, "server", "ps 1", "killed by SIGKILL", "everything", 1.0,
                               {"worker 0": None, "worker 1": None}, ["worker 0", "worker 1"])
        second.inherit(first)
        self.assertIn("not complete (ps 1 died; no 'resuming the job' line from worker 0, worker 1); "
                      "its steps lost are counted by the next recovery", first.unfinished("ps 1 died", True))
        second.resumed("worker 0", 200, 2.0, own=True)
        second.resumed("worker 1", 900, 2.0, own=True)
        self.assertEqual(second.lost, 20 + 60)
        self.assertIn("steps lost: 80 (async/ssp: in the workers' own steps); recovery time 1.00 s in all "
                      "(1.00 s); 1 not complete", self.summary([first, second], 3))

    def test_a_worker_dying_again_leaves_the_others_recovery_pending(self):
        # A server died (both workers restarted), then worker 1 died again before it said where
        # it resumed: worker 0's resume still completes the first recovery, and worker 1's loss
        # goes to its own.
        from ferry_launch.backend_local import Launcher
        first = self.Recovery(1, "server", "ps 0", "killed by SIGKILL", "everything", 0.0,
                              {"worker 0": 80, "worker 1": 90}, ["worker 0", "worker 1"])
        again = self.Recovery(2, "worker", "worker 1", "killed by SIGKILL", "worker 1", 1.0,
                              {"worker 1": None}, ["worker 1"])
        said = []

        class Fake:  # what Launcher.supersede uses of the launcher
            pending = [first]

            def say(self, text, err=False):
                said.append(text)

        fake = Fake()
        Launcher.supersede(fake, lambda old: "worker 1" in old.waiting, "worker 1 died again", again)
        self.assertEqual((fake.pending, said), ([first], []))  # still awaits worker 0
        self.assertTrue(first.resumed("worker 0", 60, 2.0, own=True))
        self.assertEqual(first.lost, 20)
        self.assertTrue(again.resumed("worker 1", 70, 3.0, own=True))
        self.assertEqual(again.lost, 20)

    def test_a_server_replaced_alone_loses_no_step(self):
        # --replication 2: a dead server is replaced alone (--recover); no worker restarts, no "resuming" line is
        # awaited: complete once the replacement says it listens, 0 steps lost.
        r = self.Recovery(1, "replaced", "ps 1 (pid 7)", "killed by SIGKILL", "ps 1 alone with --recover (pid 9)",
                          10.0, {"worker 0": 60, "worker 1": None}, [])
        self.assertIsNone(r.lost)
        self.assertIn("recovery 1: ps 1 (pid 7) died (killed by SIGKILL); restarted ps 1 alone with --recover (pid 9); "
                      "not complete (ps 2 died first; the replacement never said it listens)",
                      r.unfinished("ps 2 died first"))
        self.assertFalse(r.resumed("worker 0", 60, 11.0))  # it awaits no worker
        r.up(10.75)
        self.assertEqual(r.lost, 0)
        self.assertEqual(r.report(3), "recovery 1 of at most 3: ps 1 (pid 7) died (killed by SIGKILL); restarted ps 1 "
                                      "alone with --recover (pid 9); its replacement is up (it took the dead one's "
                                      "state from the replicas and listens), and the workers, restarted by none, go "
                                      "on where they were (their last steps reported before the death: worker 0 60, "
                                      "worker 1 (none)); steps lost: 0; recovery time 0.75 s (from noticing the "
                                      "death to the replacement's 'listening on' line)")
        worker = self.Recovery(2, "worker", "worker 1", "killed by SIGKILL", "worker 1", 20.0, {"worker 1": 70},
                               ["worker 1"])
        worker.resumed("worker 1", 71, 20.5, own=True)
        self.assertEqual(self.summary([r, worker], 3),
                         "recovery summary: 2 restarts of at most 3 (1 after a worker died, 1 after a server died, 1 "
                         "of them replaced alone with --recover); steps lost: 0 (async/ssp: in the workers' own "
                         "steps); recovery time 1.25 s in all (0.75 s, 0.50 s)")

    def test_the_resuming_line_says_whose_steps(self):
        import queue

        class Task:
            role, name = "worker", "worker 1"

        class Proc:
            task, last_step = Task(), None

        events = queue.Queue()
        watch, p = self.JobWatch(events), Proc()
        watch.see(p, "[worker 1] resuming the job at step 1230 of 1500 of its own (epoch 3, step 30 of it)")
        kind, proc, step, _, own = events.get_nowait()
        self.assertEqual((kind, proc, step, own), ("resumed", p, 1230, True))
        watch.see(p, "[worker 1] resuming the job at step 60 of 100 (epoch 1, step 60 of it)")
        kind, proc, step, _, own = events.get_nowait()
        self.assertEqual((step, own), (60, False))
        self.assertEqual(watch.last_steps([p]), {"worker 1": 1230})


@unittest.skipUnless(os.access(PS_BIN, os.X_OK) and os.access(TRAINER_BIN, os.X_OK),
                     f"ferry-ps / ferry-trainer not built under {BUILD_DIR}")
class ReplicationTest(unittest.TestCase):
    """Issue 38, replicas (protocol 1.21) with the real binaries under the launcher: an async ctr
    job of 3 servers and 2 workers with --replication 2, each server forwarding every update it
    applies to the next, over tcp. Each ferry-ps says at its end what its replication did: every
    update it applied was forwarded, and its backup applied exactly those to its replica."""

    LINE = re.compile(r"\[ps (\d)\] ferry-ps rank \d: replicas: (\d+) updates applied here, (\d+) forwarded to "
                      r"its backup \(server (\d)\), (\d+) applied to its replica of server (\d)'s slots, "
                      r"(\d+) replication errors")

    def test_every_update_applied_reaches_the_next_servers_replica(self):
        with tempfile.TemporaryDirectory(prefix="ferry-replicas-test-") as tmp:
            rc, out = run_launcher(["--num-ps", "3", "--num-workers", "2", "--base-port", "0", "--gpus-per-host", "0",
                                    "--bin-dir", BUILD_DIR, "--log-dir", os.path.join(tmp, "logs"),
                                    "--replication", "2", "--",
                                    "--model", "ctr", "--ctr-train", "2000", "--ctr-test", "200", "--steps", "40",
                                    "--batch", "32", "--consistency", "async", "--log-every", "20",
                                    "--blas-threads", "1", "--optimizer", "adam", "--lr", "0.01"], timeout=120)
            self.assertEqual(rc, 0, out)
            found = {int(m[0]): [int(x) for x in m[1:]] for m in self.LINE.findall(out)}
            self.assertEqual(sorted(found), [0, 1, 2], out)
            for rank, (applied, forwarded, backup, _, primary, errors) in found.items():
                self.assertEqual((backup, primary), ((rank + 1) % 3, (rank + 2) % 3), out)
                self.assertGreater(applied, 0, out)
                self.assertEqual(forwarded, applied, out)
                self.assertEqual(found[backup][3], forwarded, out)  # the backup's replica took them all
                self.assertEqual(errors, 0, out)

    # ferry-ps's lines at its end, one per dense table holding chunks there: how many, and the fewest and most updates
    # (versions) any of them took over the job, a replacement's taken over from the replica it started from.
    DENSE = re.compile(r"^\[ps (\d)\] ferry-ps rank (\d): table '([^']+)': (\d+) dense chunk\(s\) here, each updated "
                       r"(\d+) to (\d+) times$", re.M)

    def test_sigkill_of_a_server_loses_no_update(self):
        # Failover (protocol 1.22): ps 1 of an async ctr job of 3 servers and 2 workers with --replication 2, and no
        # checkpoint folder, is SIGKILLed once a worker reached step 60. The launcher restarts it alone, with
        # --recover, at its endpoint (--base-port 0: the port picked at the start); it takes its slots from server
        # 2's replica and its replica of server 0's slots from server 0; the workers wait for it, send again what
        # it had not answered, and go on: none is restarted, each takes its 200 steps. No update is lost or applied
        # twice: an async worker pushes every dense table once a step (trainer/src/trainer.cc Step: one
        # model_->Push(*store_, t) for each of its steps 0..199; ctr.cc Push -> Tower::Push -> ParamStore::Push,
        # which sends each dense table once, in the exchange or PushDense), and each push updates each chunk of
        # the table once, so at the end every chunk on every server, the replacement's included, took exactly
        # 2 workers x 200 steps = 400 updates.
        workers, steps = 2, 200
        with tempfile.TemporaryDirectory(prefix="ferry-replicas-test-") as tmp:
            r = Run(["--num-ps", "3", "--num-workers", str(workers), "--base-port", "0", "--gpus-per-host", "0",
                     "--bin-dir", BUILD_DIR, "--log-dir", os.path.join(tmp, "logs"), "--replication", "2", "--",
                     "--model", "ctr", "--ctr-train", "2000", "--ctr-test", "200", "--ctr-fields", "8",
                     "--ctr-dense", "4", "--emb-dim", "16", "--hidden", "512,512", "--steps", str(steps),
                     "--batch", "32", "--consistency", "async", "--log-every", "10", "--blas-threads", "1",
                     "--optimizer", "adam", "--lr", "0.01"])
            self.addCleanup(lambda: r.proc.poll() is None and r.proc.kill())
            r.wait_for(r"^\[worker \d\] step 60/200 ", 60)
            victim = r.pids()["ps 1"]
            os.kill(victim, signal.SIGKILL)
            rc = r.finish(120)
            out = r.output
        self.assertEqual(rc, 0, out)
        # ps 1 alone restarted, with its command and --recover (the same --bind: the workers and servers connect
        # there again); nothing else restarted or stopped before the end.
        self.assertIn(f"ps 1 (pid {victim}) died (killed by SIGKILL); replication 2: restarting it alone with "
                      "--recover (it takes its state from servers 2 and 0); the workers wait for it (restart 1 of at "
                      "most 3)", out)
        cmds = started_commands(out)
        self.assertEqual(len(cmds["ps 1"]), 2, out)
        self.assertEqual(cmds["ps 1"][1], cmds["ps 1"][0] + " --recover", out)
        self.assertEqual({name: len(c) for name, c in cmds.items() if name != "ps 1"},
                         {"ps 0": 1, "ps 2": 1, "worker 0": 1, "worker 1": 1}, out)
        self.assertNotIn("restarting it with --resume", out)
        self.assertNotIn("restarting every process", out)
        self.assertEqual(stops(out), [(["ps 0", "ps 1", "ps 2"], "all workers finished")], out)
        listening = re.findall(r"(?m)^\[ps 1\] ferry-ps rank 1 of 3 listening on (\S+)", out)
        self.assertEqual(len(listening), 2, out)
        self.assertEqual(listening[0], listening[1], out)
        m = re.search(rf"recovery 1 of at most 3: ps 1 \(pid {victim}\) died \(killed by SIGKILL\); restarted ps 1 "
                      r"alone with --recover \(pid \d+\); its replacement is up \(it took the dead one's state from "
                      r"the replicas and listens\), and the workers, restarted by none, go on where they were \(their "
                      r"last steps reported before the death: worker 0 (\d+|\(none\)), worker 1 (\d+|\(none\))\); "
                      r"steps lost: 0; recovery time ([\d.]+) s \(from noticing the death to the replacement's "
                      r"'listening on' line\)", out)
        self.assertTrue(m, out)
        before = [int(s) for s in m.group(1, 2) if s != "(none)"]
        self.assertGreaterEqual(max(before, default=0), 60, out)  # killed once a worker said step 60
        self.assertTrue(len(before) < workers or min(before) < steps, f"ps 1 died after the last step:\n{out}")
        self.assertIn("recovery summary: 1 restart of at most 3 (0 after a worker died, 1 after a server died, 1 of "
                      "them replaced alone with --recover); steps lost: 0; recovery time", out)
        for w in range(workers):
            self.assertRegex(out, rf"(?m)^\[worker {w}\] step {steps}/{steps} ")
            self.assertIn(f"worker {w} finished (exit status 0)", out)
        # No update lost or applied twice. The ctr tower's dense tables (trainer/models/mlp.cc, Mlp::TableSpecs; in
        # chunks of 2^16 floats): input 8 fields x 16 floats, side input 4 dense features, --hidden 512,512, one
        # output. ctr/w1 has 4 chunks, which go round the 3 servers (placement.h ChunkSlot): each one holds some.
        sizes = {"ctr/w0": 128 * 512, "ctr/w0s": 4 * 512, "ctr/b0": 512, "ctr/w1": 512 * 512, "ctr/b1": 512,
                 "ctr/w2": 512, "ctr/b2": 1}
        chunks = {name: -(-n // (1 << 16)) for name, n in sizes.items()}
        held, seen = collections.Counter(), collections.Counter()
        for shown, rank, name, n, least, most in self.DENSE.findall(out):
            self.assertEqual(shown, rank, out)
            self.assertIn(name, chunks, out)
            self.assertEqual((int(least), int(most)), (workers * steps, workers * steps),
                             f"server {rank}, table '{name}': its chunks took {least} to {most} updates, not "
                             f"{workers * steps}:\n{out}")
            held[name] += int(n)
            seen[int(rank)] += 1
        self.assertEqual(dict(held), chunks, out)  # every chunk reported, once, by the server that holds it
        self.assertEqual(sorted(seen), [0, 1, 2], out)  # the replacement among them
        # The replicas. Each ferry-ps counts from its own start: ps 1's lines are the replacement's. ps 2 -> ps 0 was
        # never touched: as in a job without a death. ps 1 forwarded all it applied to ps 2, whose replica took them
        # (and the dead ps 1's before). No replication error on ps 0 (its pushes that waited for the dead backup were
        # answered once the replacement took ps 0's image) nor on ps 1. Not asserted: ps 2's errors (a late
        # Replicate of the dead ps 1 that ps 2 reads after the replacement took over is refused and counted: its
        # worker sends that push again to the replacement), and ps 0's forwarded count (some went to the dead one).
        found = {int(m[0]): [int(x) for x in m[1:]] for m in self.LINE.findall(out)}
        self.assertEqual(sorted(found), [0, 1, 2], out)
        for rank, (applied, _, backup, _, primary, _) in found.items():
            self.assertEqual((backup, primary), ((rank + 1) % 3, (rank + 2) % 3), out)
            self.assertGreater(applied, 0, out)
        self.assertEqual(found[2][1], found[2][0], out)
        self.assertEqual(found[0][3], found[2][1], out)
        self.assertEqual(found[1][1], found[1][0], out)
        self.assertGreaterEqual(found[2][3], found[1][1], out)
        self.assertEqual((found[0][5], found[1][5]), (0, 0), out)
        pids = [pid for _, pid in all_pids(out)]
        wait_until_gone(pids)
        self.assertEqual([pid for pid in pids if pid_alive(pid)], [], "processes survived the launcher")

    SYNC_JOB = ["--model", "ctr", "--ctr-train", "2000", "--ctr-test", "400", "--ctr-fields", "8", "--ctr-dense", "4",
                "--emb-dim", "16", "--hidden", "256,256", "--steps", "200", "--batch", "32", "--consistency", "sync",
                "--log-every", "10", "--blas-threads", "1", "--optimizer", "adam", "--lr", "0.01",
                "--straggler", "1:10ms"]  # (2 s or more: the kill comes in the middle)

    @staticmethod
    def ctr_eval(output):
        """Worker 0's final test AUC, log-loss and accuracy, as printed, or None."""
        found = re.findall(r"^\[worker 0\] done: .*; (test AUC \S+, log-loss \S+, accuracy \S+)$", output, re.M)
        return found[-1] if found else None

    def test_sigkill_of_a_server_keeps_a_sync_job_exact(self):
        # Failover of sync tables (protocol 1.23): ps 1 of a sync ctr job of 3 servers and 2 workers with
        # --replication 2 is SIGKILLed once a worker reached step 60, and replaced alone with --recover. Its backup
        # held every gradient ps 1 held for its open step (a sync push is answered once the backup holds it), and
        # closed every step ps 1 closed, by the same function: the job ends with the test loss and accuracy of the
        # same job that lost no server, to the last printed digit, and every dense chunk took exactly one update a
        # step (200), the replacement's included.
        steps = 200
        with tempfile.TemporaryDirectory(prefix="ferry-replicas-test-") as tmp:
            common = ["--num-ps", "3", "--num-workers", "2", "--base-port", "0", "--gpus-per-host", "0",
                      "--bin-dir", BUILD_DIR, "--replication", "2"]
            rc, whole = run_launcher(common + ["--log-dir", os.path.join(tmp, "whole"), "--"] + self.SYNC_JOB,
                                     timeout=180)
            self.assertEqual(rc, 0, whole)
            want = self.ctr_eval(whole)
            self.assertIsNotNone(want, whole)
            r = Run(common + ["--log-dir", os.path.join(tmp, "killed"), "--"] + self.SYNC_JOB)
            self.addCleanup(lambda: r.proc.poll() is None and r.proc.kill())
            r.wait_for(r"^\[worker \d\] step 60/200 ", 90)
            victim = r.pids()["ps 1"]
            os.kill(victim, signal.SIGKILL)
            rc = r.finish(180)
            out = r.output
        self.assertEqual(rc, 0, out)
        self.assertIn(f"ps 1 (pid {victim}) died (killed by SIGKILL); replication 2: restarting it alone with "
                      "--recover", out)
        cmds = started_commands(out)
        self.assertEqual({name: len(c) for name, c in cmds.items()},
                         {"ps 0": 1, "ps 1": 2, "ps 2": 1, "worker 0": 1, "worker 1": 1}, out)
        self.assertIn("steps lost: 0", out)
        self.assertEqual(self.ctr_eval(out), want, f"uninterrupted: {want}\n{out}")
        seen = set()
        for shown, rank, name, n, least, most in self.DENSE.findall(out):
            self.assertEqual((int(least), int(most)), (steps, steps),
                             f"server {rank}, table '{name}': its chunks took {least} to {most} updates, not "
                             f"{steps}:\n{out}")
            seen.add(int(rank))
        self.assertIn(1, seen, out)  # the replacement among them (ps 2 holds no dense chunk of this tower)
        pids = [pid for _, pid in all_pids(out)]
        wait_until_gone(pids)
        self.assertEqual([pid for pid in pids if pid_alive(pid)], [], "processes survived the launcher")


def stops(output):
    """[(sorted names, why)] of the launcher's "stopping NAME, ... (WHY)" lines, in order."""
    return [(sorted(names.split(", ")), why)
            for names, why in re.findall(r"ferry-launch: stopping (.*?) \((.*)\)$", output, re.M)]


# Stand-ins for ServerReplacementTest. A ferry-ps that binds its --bind port ("stub ps rank R pid N bound port P"),
# then, with --recover, takes FERRY_STUB_RECOVER_S seconds to take its state from its peers, and only then prints
# ferry-ps's "ferry-ps rank R of N listening on ENDPOINT" and sleeps (as ferry-ps --recover does: it binds first, so
# its port accepts TCP before it is up). With --recover and FERRY_STUB_RECOVER_EXIT=2 it refuses the flag at once
# (a ferry-ps without --recover); with another status it exits with that status after the delay, saying why (3:
# ferry-ps could not take its state from its peers); with FERRY_STUB_WATCH_BACKUP=1 it exits 1 during the delay
# as soon as its backup's port refuses connections (a replacement that lost a peer). SIGUSR1: it closes its
# port, and exits 1 0.2 s later (a server whose death is noticed late). A ferry-trainer that says step 10
# (worker 0 with FERRY_STUB_SAVED=1: and a checkpoint of step 10), with --resume that it resumes at step 10, then
# exits 0 once the file FERRY_STUB_FINISH exists.
STUB_REPLICA_PS = textwrap.dedent(f"""\
    #!{sys.executable}
    import os, re, signal, socket, sys, time
    argv = sys.argv[1:]
    rank, num = int(argv[argv.index("--rank") + 1]), argv[argv.index("--num-servers") + 1]
    host, port = re.fullmatch(r"tcp://(.+):(\\d+)", argv[argv.index("--bind") + 1]).groups()
    recover, code = "--recover" in argv, os.environ.get("FERRY_STUB_RECOVER_EXIT")
    if recover and code == "2":
        print("stub ps: unknown flag --recover", flush=True)
        sys.exit(2)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    s.listen()
    print(f"stub ps rank {{rank}} pid {{os.getpid()}} bound port {{port}}", flush=True)

    def leave(*_):
        s.close()
        time.sleep(0.2)
        os._exit(1)

    signal.signal(signal.SIGUSR1, leave)
    if recover:
        peers = argv[argv.index("--peers") + 1].split(",")
        backup = (rank + 1) % len(peers)
        deadline = time.monotonic() + float(os.environ.get("FERRY_STUB_RECOVER_S", "0"))
        while time.monotonic() < deadline:
            if os.environ.get("FERRY_STUB_WATCH_BACKUP") == "1":
                try:
                    socket.create_connection(("127.0.0.1", int(peers[backup].rsplit(":", 1)[1])), 1).close()
                except OSError:
                    print(f"ferry-ps: --recover: lost server {{backup}} (stub)", flush=True)
                    sys.exit(1)
            time.sleep(0.05)
        if code:
            print(f"ferry-ps: --recover: server {{backup}} refused to send its replica (stub)", flush=True)
            sys.exit(int(code))
    print(f"ferry-ps rank {{rank}} of {{num}} listening on tcp://{{host}}:{{port}}", flush=True)
    time.sleep(120)
    """)
STUB_WAITING_TRAINER = textwrap.dedent(f"""\
    #!{sys.executable}
    import os, sys, time
    argv = sys.argv[1:]
    rank = argv[argv.index("--rank") + 1]
    print(f"stub trainer rank {{rank}} pid {{os.getpid()}} args {{argv}}", flush=True)
    if "--resume" in argv:
        print(f"[worker {{rank}}] resuming the job at step 10 of 100", flush=True)
    print(f"[worker {{rank}}] step 10/100 epoch 1/1: loss 0.5", flush=True)
    if rank == "0" and os.environ.get("FERRY_STUB_SAVED") == "1":
        print("[worker 0] checkpoint of step 10 saved: stub", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(os.environ["FERRY_STUB_FINISH"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    """)


class ServerReplacementTest(unittest.TestCase):
    """--replication 2: a dead server restarts alone with --recover, with stand-ins for ferry-ps and ferry-trainer (no
    --recover needed from the binaries): its command and endpoint, the workers left running, the restarts counted,
    when the replacement is up (its "listening on" line, not its port), the fall back to the checkpoint when two
    servers are dead at once, the replacement refuses the flag (exit 2), cannot take its state from its peers (exit
    3) or is not up in time."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-launch-test-")
        self.dir = self.tmp.name
        self.finish = os.path.join(self.dir, "finish")  # the stand-in workers exit 0 once it exists

    def tearDown(self):
        self.tmp.cleanup()

    def run_job(self, extra=(), env=None):
        d = os.path.join(self.dir, "bin")
        os.makedirs(d, exist_ok=True)
        write_script(os.path.join(d, "ferry-ps"), STUB_REPLICA_PS)
        write_script(os.path.join(d, "ferry-trainer"), STUB_WAITING_TRAINER)
        r = Run(["--num-ps", "3", "--num-workers", "2", "--base-port", "0", "--gpus-per-host", "0", "--grace", "1",
                 "--bin-dir", d, "--log-dir", os.path.join(self.dir, "logs"), "--replication", "2"] + list(extra),
                env=dict(env or {}, FERRY_STUB_FINISH=self.finish))
        self.addCleanup(lambda: r.proc.poll() is None and r.proc.kill())
        for w in (0, 1):
            r.wait_for(rf"^\[worker {w}\] step 10/100 ", 30)
        return r

    def end_job(self, r):
        with open(self.finish, "w"):
            pass
        rc = r.finish(30)
        pids = [int(p) for p in re.findall(r"stub (?:ps|trainer) rank \d+ pid (\d+)", r.output)]
        pids += [pid for _, pid in all_pids(r.output)]
        wait_until_gone(pids)
        self.assertEqual([p for p in pids if pid_alive(p)], [], "stand-ins survived")
        return rc, r.output

    def test_the_replacement_runs_the_same_command_with_recover_not_restore(self):
        load_launcher_module()
        from ferry_launch.cli import load_cluster, parse_args
        from ferry_launch.commands import Binaries, build_commands
        for resume in (False, True):
            ap, opts = parse_args(["--num-ps", "2", "--num-workers", "1", "--base-port", "7470", "--replication", "2",
                                   "--ps-arg=--max-wait-s 30", "--bin-dir", BUILD_DIR]
                                  + (["--resume", self.dir] if resume else []))
            cluster = load_cluster(ap, opts)
            build_commands(cluster, Binaries(opts.bin_dir), opts, lambda t: [])
            for t in cluster.ps:
                self.assertEqual("--restore" in t.argv, resume)
                # Its own command (its --bind, --peers, --ps-arg flags), without --restore, with --recover.
                self.assertEqual(t.recover_argv, [w for w in t.argv if w != "--restore"][:-2]
                                 + ["--recover", "--max-wait-s", "30"])
                self.assertEqual(t.command(resumed=True, recover=True), (t.recover_argv, t.env))
        ap, opts = parse_args(["--num-ps", "2", "--num-workers", "1", "--bin-dir", BUILD_DIR])
        cluster = load_cluster(ap, opts)
        build_commands(cluster, Binaries(opts.bin_dir), opts, lambda t: [])
        self.assertEqual([t.recover_argv for t in cluster.ps], [None, None])  # no replicas, no --recover
        rc, out = run_in_process(["--num-ps", "2", "--num-workers", "1", "--dry-run", "--ps-arg=--recover"])
        self.assertEqual(rc, 2, out)
        self.assertIn("--ps-arg flag --recover is set by the launcher; remove it", out)
        rc, out = run_in_process(["--num-ps", "2", "--num-workers", "1", "--dry-run", "--replication", "2"])
        self.assertEqual(rc, 0, out)
        self.assertIn("a dead server: it alone restarts with --recover, taking its state from its neighbours' "
                      "replicas, while the workers wait for it; two dead at once: everything stops", out)

    def test_a_dead_server_restarts_alone_with_recover_at_its_endpoint_twice(self):
        r = self.run_job(env={"FERRY_STUB_RECOVER_S": "0.3"})
        first = r.pids()["ps 1"]
        os.kill(first, signal.SIGKILL)
        r.wait_for(r"recovery 1 of at most 3: ps 1 ", 30)
        second = r.pids()["ps 1"]  # (the newest "started" line's)
        self.assertNotEqual(second, first)
        os.kill(second, signal.SIGKILL)  # the replacement dies too: replaced the same way, counted again
        r.wait_for(r"recovery 2 of at most 3: ps 1 ", 30)
        rc, out = self.end_job(r)
        self.assertEqual(rc, 0, out)
        for n, pid in ((1, first), (2, second)):
            self.assertIn(f"ps 1 (pid {pid}) died (killed by SIGKILL); replication 2: restarting it alone with "
                          "--recover (it takes its state from servers 2 and 0); the workers wait for it (restart "
                          f"{n} of at most 3)", out)
            m = re.search(rf"recovery {n} of at most 3: ps 1 \(pid {pid}\) died \(killed by SIGKILL\); restarted ps 1 "
                          r"alone with --recover \(pid \d+\); its replacement is up \(it took the dead one's state "
                          r"from the replicas and listens\), and the workers, restarted by none, go on where they were "
                          r"\(their last steps reported before the death: worker 0 10, worker 1 10\); steps lost: 0; "
                          r"recovery time ([\d.]+) s \(from noticing the death to the replacement's 'listening on' "
                          r"line\)", out)
            self.assertTrue(m, out)
            self.assertGreaterEqual(float(m.group(1)), 0.3)  # up once it says it listens, after taking its state
        cmds = started_commands(out)
        self.assertEqual(cmds["ps 1"][1:], [cmds["ps 1"][0] + " --recover"] * 2, out)
        self.assertEqual({name: len(c) for name, c in cmds.items() if name != "ps 1"},
                         {"ps 0": 1, "ps 2": 1, "worker 0": 1, "worker 1": 1}, out)
        ports = re.findall(r"(?m)^\[ps 1\] stub ps rank 1 pid \d+ bound port (\d+)$", out)
        self.assertEqual(len(ports), 3, out)
        self.assertEqual(len(set(ports)), 1, out)  # --base-port 0: the port picked at the start, each time
        self.assertEqual(stops(out), [(["ps 0", "ps 1", "ps 2"], "all workers finished")], out)
        self.assertIn("recovery summary: 2 restarts of at most 3 (0 after a worker died, 2 after a server died, 2 of "
                      "them replaced alone with --recover); steps lost: 0; recovery time", out)

    def test_a_second_death_before_the_replacement_is_up_falls_back_to_the_checkpoint(self):
        # The replacement of ps 1 takes 5 s to take its state; ps 2 dies meanwhile: ps 1's slots may be gone
        # from both their copies (on ps 1 and ps 2), so every process restarts from the checkpoint.
        r = self.run_job(extra=["--checkpoint-dir", os.path.join(self.dir, "ckpt")],
                         env={"FERRY_STUB_RECOVER_S": "5", "FERRY_STUB_SAVED": "1"})
        r.wait_for(r"^\[worker 0\] checkpoint of step 10 saved", 30)
        pids = r.pids()
        os.kill(pids["ps 1"], signal.SIGKILL)
        r.wait_for(r"restarting it alone with --recover", 30)
        os.kill(pids["ps 2"], signal.SIGKILL)
        r.wait_for(r"recovery 2 of at most 3: ps 2 ", 30)
        rc, out = self.end_job(r)
        self.assertEqual(rc, 0, out)
        replacement = re.search(r"restarted ps 1 pid (\d+): .* --recover$", out, re.M)
        self.assertTrue(replacement, out)
        self.assertIn(f"recovery 1: ps 1 (pid {pids['ps 1']}) died (killed by SIGKILL); restarted ps 1 alone with "
                      f"--recover (pid {replacement.group(1)}); not complete (ps 2 died first; the replacement never "
                      "said it listens)", out)
        self.assertIn(f"ps 2 (pid {pids['ps 2']}) died (killed by SIGKILL) before ps 1's replacement was up; with "
                      "replication 2 a server's slots are on it and on the next server only, so two servers dead at "
                      "once may have taken both copies of some: every process restarts from the newest checkpoint "
                      "instead", out)
        self.assertIn(f"ps 2 (pid {pids['ps 2']}) died (killed by SIGKILL); restarting every process from the newest "
                      "checkpoint (step 10 or later)", out)
        self.assertIn(f"recovery 2 of at most 3: ps 2 (pid {pids['ps 2']}) died (killed by SIGKILL); restarted ps 0, "
                      "ps 1, ps 2 with --restore and worker 0, worker 1 with --resume; the job resumed at step 10", out)
        cmds = started_commands(out)
        for rank in (0, 1, 2):
            self.assertTrue(cmds[f"ps {rank}"][-1].endswith(" --restore"), out)
        self.assertIn("recovery summary: 2 restarts of at most 3 (0 after a worker died, 2 after a server died, 1 of "
                      "them replaced alone with --recover); steps lost: 0; recovery time", out)
        self.assertIn("; 1 not complete", out)

    def test_a_replacement_that_refuses_recover_falls_back_to_the_checkpoint(self):
        # A ferry-ps without --recover exits 2: another try would fail the same way. Without a checkpoint
        # folder nothing can bring ps 1's state back: the job stops, saying why.
        r = self.run_job(env={"FERRY_STUB_RECOVER_EXIT": "2"})
        victim = r.pids()["ps 1"]
        os.kill(victim, signal.SIGKILL)
        rc = r.finish(30)
        out = r.output
        self.assertEqual(rc, 1, out)
        replacement = re.search(r"restarted ps 1 pid (\d+): .* --recover$", out, re.M)
        self.assertTrue(replacement, out)
        self.assertEqual(len(re.findall(r"restarted ps 1 pid", out)), 1, out)
        self.assertIn(f"ps 1 (pid {replacement.group(1)}), the replacement of ps 1, exited with status 2: ferry-ps "
                      "refused its flags (one without --recover?), and a restart would fail the same way: only a "
                      "checkpoint could bring its state back now", out)
        self.assertIn("cannot recover from the death of ps 1: a server's state comes back only from a checkpoint, "
                      "and there is no checkpoint folder (--checkpoint-dir DIR)", out)
        self.assertIn("stub ps: unknown flag --recover", out)  # the failure summary shows why
        self.assertIn("recovery summary: 1 restart of at most 3 (0 after a worker died, 1 after a server died, 1 of "
                      "them replaced alone with --recover); steps lost: 0; 1 not complete", out)
        self.assertNotRegex(out, r"restarted worker")

    def test_a_replacement_that_cannot_take_its_state_falls_back_to_the_checkpoint(self):
        # ferry-ps --recover exits 3 when its peers could not give it its state (a peer refused, timed out, sent a bad
        # image; no memory): not replaced again, every process restarts from the checkpoint.
        r = self.run_job(extra=["--checkpoint-dir", os.path.join(self.dir, "ckpt")],
                         env={"FERRY_STUB_RECOVER_EXIT": "3", "FERRY_STUB_RECOVER_S": "0.3", "FERRY_STUB_SAVED": "1"})
        r.wait_for(r"^\[worker 0\] checkpoint of step 10 saved", 30)
        victim = r.pids()["ps 1"]
        os.kill(victim, signal.SIGKILL)
        r.wait_for(r"recovery 2 of at most 3: ps 1 ", 30)
        rc, out = self.end_job(r)
        self.assertEqual(rc, 0, out)
        replacement = re.search(r"restarted ps 1 pid (\d+): .* --recover$", out, re.M)
        self.assertTrue(replacement, out)
        self.assertEqual(len(re.findall(r"restarted ps 1 pid \d+: .* --recover$", out, re.M)), 1, out)  # not again
        new = replacement.group(1)
        self.assertIn(f"recovery 1: ps 1 (pid {victim}) died (killed by SIGKILL); restarted ps 1 alone with --recover "
                      f"(pid {new}); not complete (the replacement ended first: exit status 3; the replacement never "
                      "said it listens)", out)
        self.assertIn(f"ps 1 (pid {new}), the replacement of ps 1, exited with status 3: ferry-ps could not take "
                      "ps 1's state from servers 2 and 0 (it says: ferry-ps: --recover: server 2 refused to send its "
                      "replica (stub)): every process restarts from the newest checkpoint instead", out)
        self.assertIn(f"recovery 2 of at most 3: ps 1 (pid {new}) died (exit status 3); restarted ps 0, ps 1, ps 2 "
                      "with --restore and worker 0, worker 1 with --resume; the job resumed at step 10", out)
        cmds = started_commands(out)
        for rank in (0, 1, 2):
            self.assertTrue(cmds[f"ps {rank}"][-1].endswith(" --restore"), out)
        self.assertIn("recovery summary: 2 restarts of at most 3 (0 after a worker died, 2 after a server died, 1 of "
                      "them replaced alone with --recover); steps lost: 0; recovery time", out)
        self.assertIn("; 1 not complete", out)

    def test_a_replacement_that_cannot_take_its_state_without_a_checkpoint_stops_the_job(self):
        r = self.run_job(env={"FERRY_STUB_RECOVER_EXIT": "3"})
        victim = r.pids()["ps 1"]
        os.kill(victim, signal.SIGKILL)
        rc = r.finish(30)
        out = r.output
        self.assertEqual(rc, 1, out)
        replacement = re.search(r"restarted ps 1 pid (\d+): .* --recover$", out, re.M)
        self.assertTrue(replacement, out)
        self.assertEqual(len(re.findall(r"restarted ps 1 pid", out)), 1, out)
        self.assertIn(f"ps 1 (pid {replacement.group(1)}), the replacement of ps 1, exited with status 3: ferry-ps "
                      "could not take ps 1's state from servers 2 and 0 (it says: ferry-ps: --recover: server 2 "
                      "refused to send its replica (stub)): only a checkpoint could bring its state back now", out)
        self.assertIn("cannot recover from the death of ps 1: a server's state comes back only from a checkpoint, "
                      "and there is no checkpoint folder (--checkpoint-dir DIR)", out)
        self.assertRegex(out, rf"FAILED: ps 1 \(pid {replacement.group(1)}\) exited unexpectedly: exit status 3\n"
                              r".*\n +ferry-ps: --recover: server 2 refused to send its replica \(stub\)")
        self.assertIn("recovery summary: 1 restart of at most 3 (0 after a worker died, 1 after a server died, 1 of "
                      "them replaced alone with --recover); steps lost: 0; 1 not complete", out)
        self.assertNotRegex(out, r"restarted worker")

    def test_a_replacement_whose_port_accepts_is_not_up_before_its_listening_line(self):
        # ferry-ps --recover binds its endpoint first, then takes its state (here 2 s), then says it listens: the
        # launcher waits for that line, not for the port.
        r = self.run_job(env={"FERRY_STUB_RECOVER_S": "2"})
        victim = r.pids()["ps 1"]
        port = int(re.search(r"(?m)^\[ps 1\] stub ps rank 1 pid \d+ bound port (\d+)$", r.output).group(1))
        os.kill(victim, signal.SIGKILL)
        r.wait_for(r"restarted ps 1 pid \d+: .* --recover$", 30)
        deadline = time.monotonic() + 10
        while True:  # the replacement's port accepts connections ...
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                self.assertLess(time.monotonic(), deadline, r.output)
                time.sleep(0.02)
        time.sleep(0.5)
        self.assertNotIn("recovery 1 of at most 3", r.output)  # ... but it is not up
        self.assertNotRegex(r.output, r"(?m)^\[worker \d\] stub trainer rank \d+ pid \d+ args .*--resume")
        r.wait_for(r"recovery 1 of at most 3: ps 1 ", 30)
        rc, out = self.end_job(r)
        self.assertEqual(rc, 0, out)
        lines = out.splitlines()
        said = [i for i, l in enumerate(lines) if re.match(r"\[ps 1\] ferry-ps rank 1 of 3 listening on ", l)]
        up = [i for i, l in enumerate(lines) if "recovery 1 of at most 3: ps 1 " in l]
        self.assertEqual(len(said), 2, out)  # the first start's and the replacement's
        self.assertLess(said[1], up[0], out)
        m = re.search(r"recovery 1 of at most 3: .*; recovery time ([\d.]+) s \(from noticing the death to the "
                      r"replacement's 'listening on' line\)", out)
        self.assertTrue(m, out)
        self.assertGreaterEqual(float(m.group(1)), 2.0, out)
        self.assertIn("recovery summary: 1 restart of at most 3 (0 after a worker died, 1 after a server died, 1 of "
                      "them replaced alone with --recover); steps lost: 0; recovery time", out)

    def test_a_replacement_not_up_in_time_falls_back_to_the_checkpoint(self):
        # --failover-timeout-s 1 (a --ps-arg): the replacement may take max(--rendezvous-timeout 5, 2 x 1 + 30) = 32 s;
        # this one would take 100. The launcher says every 10 s what it waits for, then stops it and falls back.
        r = self.run_job(extra=["--checkpoint-dir", os.path.join(self.dir, "ckpt"), "--rendezvous-timeout", "5",
                                "--ps-arg=--failover-timeout-s 1"],
                         env={"FERRY_STUB_RECOVER_S": "100", "FERRY_STUB_SAVED": "1"})
        r.wait_for(r"^\[worker 0\] checkpoint of step 10 saved", 30)
        victim = r.pids()["ps 1"]
        os.kill(victim, signal.SIGKILL)
        r.wait_for(r"recovery 2 of at most 3: ps 1 ", 60)
        rc, out = self.end_job(r)
        self.assertEqual(rc, 0, out)
        new = re.search(r"restarted ps 1 pid (\d+): .* --recover --failover-timeout-s 1$", out, re.M).group(1)
        for waited in (10, 20, 30):
            self.assertIn(f"waiting for ps 1 (pid {new}), the replacement of ps 1, to take its state from servers 2 "
                          f"and 0 and say it listens, {waited} s (at most 32 s)", out)
        self.assertNotIn("32 s (at most 32 s)", out)
        self.assertIn(f"recovery 1: ps 1 (pid {victim}) died (killed by SIGKILL); restarted ps 1 alone with --recover "
                      f"(pid {new}); not complete (not up within 32 s; the replacement never said it listens)", out)
        self.assertIn(f"ps 1 (pid {new}), the replacement of ps 1 (pid {victim}), did not say it listens ('ferry-ps "
                      "rank 1 of 3 listening on ...') within 32 s: every process restarts from the newest checkpoint "
                      "instead", out)
        self.assertIn(f"recovery 2 of at most 3: ps 1 (pid {new}) died (not up within 32 s: stopped by the launcher); "
                      "restarted ps 0, ps 1, ps 2 with --restore and worker 0, worker 1 with --resume; the job resumed "
                      "at step 10", out)
        self.assertEqual(stops(out)[0], (["ps 1"], "ps 1's replacement is not up after 32 s"), out)
        self.assertIn("recovery summary: 2 restarts of at most 3 (0 after a worker died, 2 after a server died, 1 of "
                      "them replaced alone with --recover); steps lost: 0; recovery time", out)

    def test_a_replacement_that_ends_as_its_peer_dies_counts_one_restart(self):
        # ps 2 stops serving (SIGUSR1) and exits 0.2 s later, while ps 1's replacement takes its state from it; the
        # replacement ends at once (it lost its peer), most often before the launcher notices ps 2's end. The launcher
        # looks for a server's death first (REPLACEMENT_SETTLE_S): the two are dead at once, which falls back to the
        # checkpoint, counted once (not a second replacement, counted, and then the fall back). On a loaded machine
        # ps 2's end may be noticed first instead: that falls back too, as a death before the replacement was up.
        r = self.run_job(extra=["--checkpoint-dir", os.path.join(self.dir, "ckpt")],
                         env={"FERRY_STUB_RECOVER_S": "30", "FERRY_STUB_WATCH_BACKUP": "1", "FERRY_STUB_SAVED": "1"})
        r.wait_for(r"^\[worker 0\] checkpoint of step 10 saved", 30)
        pids = r.pids()
        os.kill(pids["ps 1"], signal.SIGKILL)
        r.wait_for(r"restarted ps 1 pid \d+: .* --recover$", 30)
        time.sleep(0.5)
        os.kill(pids["ps 2"], signal.SIGUSR1)
        r.wait_for(r"recovery 2 of at most 3: ps ", 30)
        rc, out = self.end_job(r)
        self.assertEqual(rc, 0, out)
        self.assertEqual(len(re.findall(r"restarted ps 1 pid \d+: .* --recover$", out, re.M)), 1, out)
        new = re.search(r"restarted ps 1 pid (\d+): .* --recover$", out, re.M).group(1)
        two_dead = ("with replication 2 a server's slots are on it and on the next server only, so two servers dead at "
                    "once may have taken both copies of some: every process restarts from the newest checkpoint "
                    "instead")
        restarted = ("restarted ps 0, ps 1, ps 2 with --restore and worker 0, worker 1 with --resume; the job resumed "
                     "at step 10")
        if f"ps 2 (pid {pids['ps 2']}) died (exit status 1) before ps 1's replacement was up" in out:
            self.assertIn(f"before ps 1's replacement was up; {two_dead}", out)
            self.assertIn(f"recovery 2 of at most 3: ps 2 (pid {pids['ps 2']}) died (exit status 1); {restarted}", out)
        else:
            self.assertIn(f"ps 1's replacement and ps 2 are both dead (ps 1 (pid {new}): exit status 1; ps 2 (pid "
                          f"{pids['ps 2']}): exit status 1); {two_dead}", out)
            self.assertIn(f"recovery 2 of at most 3: ps 1 (pid {new}) died (exit status 1); {restarted}", out)
        self.assertIn("recovery summary: 2 restarts of at most 3 (0 after a worker died, 2 after a server died, 1 of "
                      "them replaced alone with --recover); steps lost: 0; recovery time", out)

    def test_the_replacement_waits_for_two_failover_timeouts(self):
        fl = load_launcher_module()
        from ferry_launch.backend_local import failover_timeout_s, replacement_wait_s
        self.assertEqual(failover_timeout_s([]), 60)  # ferry-ps's default
        self.assertEqual(failover_timeout_s(["--max-wait-s", "30", "--failover-timeout-s", "5"]), 5)
        self.assertEqual(failover_timeout_s(["--failover-timeout-s", "5", "--failover-timeout-s", "7"]), 7)  # the last
        self.assertEqual(failover_timeout_s(["--failover-timeout-s", "x"]), 60)  # ferry-ps refuses it: never reached
        for args, rendezvous, want in (([], None, 150), (["--ps-arg=--failover-timeout-s 10"], None, 60),
                                       (["--ps-arg=--failover-timeout-s 100"], "45", 230),
                                       (["--ps-arg=--failover-timeout-s 1"], "200", 200)):
            _, opts = fl.cli.parse_args(["--num-ps", "2", "--num-workers", "1", "--replication", "2"] + args
                                        + (["--rendezvous-timeout", rendezvous] if rendezvous else []))
            self.assertEqual(replacement_wait_s(opts), want, args)


class UsageErrorTest(unittest.TestCase):
    """Bad specs and flags: exit 2 with one clear line; nothing is started."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-launch-test-")

    def tearDown(self):
        self.tmp.cleanup()

    def spec_error(self, spec):
        path = os.path.join(self.tmp.name, "spec.json")
        with open(path, "w") as f:
            f.write(spec if isinstance(spec, str) else json.dumps(spec))
        rc, out = run_in_process(["--spec", path, "--bin-dir", BUILD_DIR, "--dry-run"])
        self.assertEqual(rc, 2, out)
        self.assertNotIn("started", out)
        return out

    def test_bad_specs(self):
        cases = [
            ({"worker": ["127.0.0.1"]}, "missing field 'ps'"),
            ({"cluster": {"ps": ["127.0.0.1:7000"]}}, "missing field 'cluster.worker'"),
            ({"ps": ["127.0.0.1:7000", "localhost:7000"], "worker": ["127.0.0.1"]},
             "ps[1] 'localhost:7000': duplicate address (same as ps[0])"),
            ({"ps": ["127.0.0.1:7000"], "worker": ["127.0.0.1"], "chief": ["x"]},
             "unknown field 'chief'"),
            ({"ps": ["127.0.0.1:70000"], "worker": ["127.0.0.1"]},
             "ps[0] '127.0.0.1:70000': bad port '70000'"),
            ({"ps": ["127.0.0.1:http"], "worker": ["127.0.0.1"]}, "bad port 'http'"),
            ({"ps": ["127.0.0.1"], "worker": ["127.0.0.1"]}, "ps[0] '127.0.0.1': missing port"),
            ({"ps": [], "worker": ["127.0.0.1"]}, "field 'ps' must be a non-empty list"),
            ({"ps": ["127.0.0.1:7000"], "worker": ["-oProxyCommand=x"]},
             "worker[0] '-oProxyCommand=x': bad host '-oProxyCommand=x'"),
            ("{not json", "is not valid JSON"),
            ('{"ps": ["127.0.0.1:7000"], "ps": ["127.0.0.1:7001"], "worker": ["127.0.0.1"]}',
             "duplicate field 'ps'"),
            ('{"cluster": {"ps": ["127.0.0.1:7000"], "worker": ["a"], "worker": ["b"]}}',
             "duplicate field 'worker'"),
            ({"cluster": {"ps": ["127.0.0.1:7000"], "worker": ["a"]}, "task": "worker"},
             "field 'task' must be an object"),
            ({"cluster": {"ps": ["127.0.0.1:7000"], "worker": ["a"]},
              "task": {"type": "chief", "index": 0}},
             "field 'task.type' must be \"ps\" or \"worker\", got \"chief\""),
            ({"cluster": {"ps": ["127.0.0.1:7000"], "worker": ["a"]},
              "task": {"type": "worker", "index": 1}},
             "field 'task.index' must be an integer 0..0 (an entry of 'cluster.worker'), got 1"),
            ({"cluster": {"ps": ["127.0.0.1:7000"], "worker": ["a"]},
              "task": {"type": "ps", "index": 0, "trial": 1}}, "unknown field 'task.trial'"),
            ({"ps": [f"127.0.0.1:{1 + i}" for i in range(5041)], "worker": ["127.0.0.1"]},
             "field 'ps' lists 5041 servers; at most 5040"),
        ]
        for spec, want in cases:
            with self.subTest(want=want):
                out = self.spec_error(spec)
                self.assertIn("ferry-launch: error: spec:", out)
                self.assertIn(want, out)


    def test_more_servers_than_placement_slots_are_refused(self):
        rc, out = run_in_process(["--num-ps", "5041", "--num-workers", "1", "--bin-dir", BUILD_DIR,
                                  "--base-port", "0", "--dry-run"])
        self.assertEqual(rc, 2, out)
        self.assertIn("--num-ps 5041: at most 5040 servers", out)

    def test_a_spec_that_is_not_utf8_or_nests_too_deeply_is_an_error_not_a_traceback(self):
        # Both printed a Python traceback (issue 35).
        path = os.path.join(self.tmp.name, "spec.json")
        for content, want in [(b'{"ps": ["\xff"], "worker": ["127.0.0.1"]}', "is not UTF-8 text (byte 9: b'\\xff')"),
                              (b"[" * 100000, "nests its JSON too deeply")]:
            with self.subTest(want=want):
                with open(path, "wb") as f:
                    f.write(content)
                rc, out = run_in_process(["--spec", path, "--bin-dir", BUILD_DIR, "--dry-run"])
                self.assertEqual(rc, 2, out)
                self.assertIn("ferry-launch: error: spec: " + path, out)
                self.assertIn(want, out)
                self.assertNotIn("Traceback", out)
    def test_launcher_owned_trainer_flag_rejected(self):
        rc, out = run_in_process(["--num-ps", "1", "--num-workers", "1", "--dry-run", "--",
                                "--rank", "3"])
        self.assertEqual(rc, 2, out)
        self.assertIn("trainer flag --rank is set by the launcher", out)

    def test_bad_seconds_name_the_flag(self):
        base = ["--num-ps", "1", "--num-workers", "1", "--gpus-per-host", "0", "--dry-run"]
        for flag, value in [("--rendezvous-timeout", "nan"), ("--rendezvous-timeout", "inf"),
                            ("--rendezvous-timeout", "-1"), ("--rendezvous-timeout", "0"),
                            ("--grace", "inf"), ("--grace", "-0.5"), ("--grace", "NaN"),
                            ("--ssh-timeout", "nan"), ("--grace", "1e9")]:
            with self.subTest(flag=flag, value=value):
                rc, out = run_in_process(base + [f"{flag}={value}"])
                self.assertEqual(rc, 2, out)
                self.assertIn(f"argument {flag}: want a finite number of seconds", out)
                self.assertIn(f"got '{value}'", out)
        rc, out = run_in_process(base + ["--grace", "0", "--rendezvous-timeout", "0.5"])
        self.assertEqual(rc, 0, out)

    def test_each_server_gets_a_disk_tier_folder_of_its_own(self):
        rc, out = run_in_process(["--num-ps", "2", "--num-workers", "1", "--base-port", "7470",
                                  "--gpus-per-host", "0", "--dry-run", "--disk-tier-dir", "rel/tier",
                                  "--", "--steps", "5"])
        self.assertEqual(rc, 0, out)
        cmds = command_lines(out)
        for rank in (0, 1):
            want = f"--disk-tier-dir {os.path.abspath('rel/tier')}/server-{rank}"
            self.assertTrue(cmds[f"ps {rank}"].endswith(want), cmds[f"ps {rank}"])
        self.assertNotIn("--disk-tier-dir", cmds["worker 0"])
        rc, out = run_in_process(["--num-ps", "1", "--num-workers", "1", "--dry-run",
                                  "--ps-arg=--disk-tier-dir /tmp/x"])
        self.assertEqual(rc, 2, out)
        self.assertIn("--ps-arg flag --disk-tier-dir is set by the launcher; remove it (use "
                      "--disk-tier-dir)", out)
        rc, out = run_in_process(["--num-ps", "1", "--num-workers", "1", "--dry-run", "--disk-tier-dir="])
        self.assertEqual(rc, 2, out)
        self.assertIn("argument --disk-tier-dir: empty folder name", out)

    def test_replication_2_gives_every_server_the_servers_list(self):
        rc, out = run_in_process(["--num-ps", "3", "--num-workers", "1", "--base-port", "7470",
                                  "--gpus-per-host", "0", "--dry-run", "--no-curve", "--replication", "2",
                                  "--", "--steps", "5"])
        self.assertEqual(rc, 0, out)
        cmds = command_lines(out)
        peers = "tcp://127.0.0.1:7470,tcp://127.0.0.1:7471,tcp://127.0.0.1:7472"
        for rank in (0, 1, 2):
            self.assertIn(f"--replication 2 --peers {peers}", cmds[f"ps {rank}"])
        self.assertNotIn("--replication", cmds["worker 0"])
        rc, out = run_in_process(["--num-ps", "2", "--num-workers", "1", "--dry-run", "--replication", "3"])
        self.assertEqual(rc, 2, out)
        self.assertIn("argument --replication: invalid choice: 3", out)
        rc, out = run_in_process(["--num-ps", "2", "--num-workers", "1", "--dry-run", "--ps-arg=--peers a,b"])
        self.assertEqual(rc, 2, out)
        self.assertIn("--ps-arg flag --peers is set by the launcher; remove it (use --replication)", out)
        rc, out = run_in_process(["--num-ps", "2", "--num-workers", "1", "--dry-run", "--curve",
                                  "--replication", "2"])
        self.assertEqual(rc, 2, out)
        self.assertIn("--replication 2 does not work with CURVE yet", out)

    def test_ps_args_go_to_every_server(self):
        rc, out = run_in_process(["--num-ps", "2", "--num-workers", "1", "--base-port", "7470",
                                  "--gpus-per-host", "0", "--dry-run", "--ps-arg",
                                  "--max-wait-s 30", "--ps-arg=--max-message-mb",
                                  "--ps-arg=64", "--", "--steps", "5"])
        self.assertEqual(rc, 0, out)
        cmds = command_lines(out)
        for who in ("ps 0", "ps 1"):
            self.assertTrue(cmds[who].endswith("--compute-threads 1 --metrics 127.0.0.1:0 --num-workers 1 --max-wait-s 30 "
                                               "--max-message-mb 64"), cmds[who])
        self.assertNotIn("--max-wait-s", cmds["worker 0"])
        for bad, want in [("--compute-threads 4", "--ps-arg flag --compute-threads is set by "
                                                  "the launcher; remove it (use --ps-threads)"),
                          ("--bind=tcp://*:1", "--ps-arg flag --bind=tcp://*:1 is set by the "
                                               "launcher"),
                          ("'--max-wait-s 3", "argument --ps-arg: No closing quotation")]:
            with self.subTest(bad=bad):
                rc, out = run_in_process(["--num-ps", "1", "--num-workers", "1", "--dry-run",
                                          f"--ps-arg={bad}"])
                self.assertEqual(rc, 2, out)
                self.assertIn(want, out)

    def test_metrics_endpoints_are_the_launchers_to_give(self):
        # Servers and trainers on loopback get one by default; --metrics off: none; neither
        # --ps-arg nor the trainer flags can set it.
        rc, out = run_in_process(["--num-ps", "2", "--num-workers", "1", "--dry-run", "--gpus-per-host", "0"])
        self.assertEqual(rc, 0, out)
        self.assertIn("--metrics 127.0.0.1:0", command_lines(out)["ps 1"])
        self.assertIn("--metrics 127.0.0.1:0", command_lines(out)["worker 0"])
        rc, out = run_in_process(["--num-ps", "2", "--num-workers", "1", "--dry-run", "--gpus-per-host", "0",
                                  "--metrics", "off"])
        self.assertEqual(rc, 0, out)
        for who in ("ps 0", "ps 1", "worker 0"):
            self.assertNotIn("--metrics", command_lines(out)[who])
        # A worker program is told where in its environment (ferry.torch serves its page there).
        program = ["--", "/usr/bin/python3", "train.py"]
        rc, out = run_in_process(["--num-ps", "1", "--num-workers", "1", "--dry-run", "--gpus-per-host", "0"] + program)
        self.assertEqual(rc, 0, out)
        self.assertIn("FERRY_METRICS=127.0.0.1:0 ", command_lines(out)["worker 0"])
        rc, out = run_in_process(["--num-ps", "1", "--num-workers", "1", "--dry-run", "--gpus-per-host", "0",
                                  "--metrics", "off"] + program)
        self.assertEqual(rc, 0, out)
        self.assertNotIn("FERRY_METRICS", command_lines(out)["worker 0"])
        rc, out = run_in_process(["--num-ps", "1", "--num-workers", "1", "--dry-run", "--ps-arg=--metrics 9100"])
        self.assertEqual(rc, 2, out)
        self.assertIn("--ps-arg flag --metrics is set by the launcher", out)
        rc, out = run_in_process(["--num-ps", "1", "--num-workers", "1", "--dry-run", "--", "--metrics", "9100"])
        self.assertEqual(rc, 2, out)
        self.assertIn("trainer flag --metrics is set by the launcher", out)

    def test_base_port_zero_ports_are_distinct(self):
        # Each socket stays bound until all are picked: no two servers draw the same port.
        fl = load_launcher_module()
        ports = fl.ps_ports(0, ["127.0.0.1"] * 200, "--host")
        self.assertEqual(len(set(ports)), 200)
        # Outside the kernel's ephemeral range (no outgoing connection's local port: a client reconnecting to a dead
        # server's port never takes it by a TCP self-connect), from 10000 up.
        lo, hi = fl.spec.ephemeral_ports()
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            self.assertEqual((lo, hi), tuple(int(w) for w in f.read().split()))
        self.assertEqual([p for p in ports if lo <= p <= hi or p < 10000], [])
        # Each port is tried in turn from a random start: one taken is passed over.
        with unittest.mock.patch.object(fl.spec.random, "randrange", return_value=0):
            first = fl.spec.free_ports(1)[0]
            with socket.socket() as held:
                held.bind(("127.0.0.1", first))
                second = fl.spec.free_ports(1)[0]
        self.assertGreater(second, first)
        self.assertFalse(lo <= second <= hi)
        # Each port picked is claimed for the launcher's life, so another launcher that picks while this one's servers
        # are still to bind them (or a replacement to bind one again) passes it over; a dead launcher's claim is
        # taken over; claims go at the exit.
        claim = os.path.join(fl.spec.claims_dir(), str(first))
        with open(claim) as f:
            self.assertEqual(f.read(), f"{os.getpid()}\n")
        candidates = [p for p in range(10000, 65536) if not lo <= p <= hi]
        with unittest.mock.patch.object(fl.spec.random, "randrange", return_value=candidates.index(first)):
            self.assertNotIn(first, fl.spec.free_ports(1))  # free to bind, but claimed by a live launcher
            fl.spec.release_claims()
            self.assertFalse(os.path.exists(claim))
            dead = subprocess.Popen(["true"])
            dead.wait()
            with open(claim, "w") as f:
                f.write(f"{dead.pid}\n")
            self.assertEqual(fl.spec.free_ports(1), [first])
        with open(claim) as f:
            self.assertEqual(f.read(), f"{os.getpid()}\n")
        fl.spec.release_claims()
        # A claims folder that others can write (or not this user's, or a link) is not used: no claims then.
        os.chmod(fl.spec.claims_dir(), 0o777)
        try:
            with unittest.mock.patch.object(fl.spec.random, "randrange", return_value=candidates.index(first)):
                self.assertEqual(fl.spec.free_ports(1), [first])
            self.assertFalse(os.path.exists(claim))
        finally:
            os.chmod(fl.spec.claims_dir(), 0o700)
        rc, out = run_in_process(["--num-ps", "1", "--num-workers", "1", "--host", "node7",
                                  "--base-port", "0", "--dry-run"])
        self.assertEqual(rc, 2, out)
        self.assertIn("--base-port 0 picks ports free on this machine, but --host puts a "
                      "server on node7; give a port", out)

    def test_missing_binary(self):
        rc, out = run_launcher(["--num-ps", "1", "--num-workers", "1", "--base-port", "0",
                                "--bin-dir", self.tmp.name])
        self.assertEqual(rc, 2, out)
        self.assertIn("preflight: binary not found", out)

    @unittest.skipUnless(os.access(PS_BIN, os.X_OK), "ferry-ps not built")
    def test_busy_port(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            rc, out = run_launcher(["--num-ps", "1", "--num-workers", "1", "--base-port",
                                    str(port), "--bin-dir", BUILD_DIR])
        self.assertEqual(rc, 2, out)
        self.assertIn(f"port for ps 0 at 127.0.0.1:{port} is not free", out)


def command_lines(out):
    """The "[role rank] ..." lines of a --dry-run, by role and rank."""
    return {m.group(1): m.group(2) for m in re.finditer(r"^\[(\w+(?: \d+)?)\] (.*)$", out, re.M)}


class GpuAssignmentTest(unittest.TestCase):
    """--gpus-per-host: trainer k on a host gets CUDA_VISIBLE_DEVICES = k mod N."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-launch-test-")

    def tearDown(self):
        self.tmp.cleanup()

    def test_round_robin_per_host(self):
        spec = os.path.join(self.tmp.name, "spec.json")
        with open(spec, "w") as f:
            json.dump({"ps": ["127.0.0.1:7000", "node7:7001"],
                       "worker": ["localhost", "node7", "127.0.0.1", "node7", "localhost"]}, f)
        rc, out = run_in_process(["--spec", spec, "--bin-dir", BUILD_DIR, "--gpus-per-host",
                                  "2", "--dry-run", "--", "--steps", "5"])
        self.assertEqual(rc, 0, out)
        cmds = command_lines(out)
        want = {"worker 0": "0", "worker 2": "1", "worker 4": "0",  # this host: 0, 1, 0
                "worker 1": "0", "worker 3": "1"}                   # node7: 0, 1
        for who, card in want.items():
            self.assertRegex(cmds[who], rf"^(\(on node7 over ssh\) )?CUDA_VISIBLE_DEVICES={card} "
                                        rf"\S*ferry-trainer ", who)
        for who in ("ps 0", "ps 1"):
            self.assertNotIn("CUDA_VISIBLE_DEVICES", cmds[who])
        self.assertIn("(on node7 over ssh)", cmds["ps 1"])
        self.assertIn("--bind tcp://0.0.0.0:7001", cmds["ps 1"])  # a name: all interfaces

    def test_auto_counts_nvidia_smi_and_zero_sets_nothing(self):
        fake = os.path.join(self.tmp.name, "path")
        os.makedirs(fake)
        write_script(os.path.join(fake, "nvidia-smi"), "#!/bin/sh\n" + "".join(
            f"echo 'GPU {i}: Fake GPU (UUID: GPU-{i})'\n" for i in range(3)))
        args = ["--num-ps", "1", "--num-workers", "4", "--bin-dir", BUILD_DIR, "--dry-run"]
        r = Run(args, env={"PATH": fake + os.pathsep + os.environ.get("PATH", "")})
        rc, out = r.finish(30), r.output
        self.assertEqual(rc, 0, out)
        self.assertIn("3 GPUs per host (nvidia-smi -L)", out)
        cards = [re.search(r"CUDA_VISIBLE_DEVICES=(\d)", command_lines(out)[f"worker {k}"])
                 for k in range(4)]
        self.assertEqual([c.group(1) for c in cards], ["0", "1", "2", "0"], out)
        rc, out = run_in_process(args + ["--gpus-per-host", "0"])
        self.assertEqual(rc, 0, out)
        self.assertNotIn("CUDA_VISIBLE_DEVICES", out)

    def test_cuda_visible_devices_limits_the_cards(self):
        # nvidia-smi lists 4 cards, but only 2 and 3 are visible to the launcher.
        fake = os.path.join(self.tmp.name, "path")
        os.makedirs(fake)
        write_script(os.path.join(fake, "nvidia-smi"), "#!/bin/sh\n" + "".join(
            f"echo 'GPU {i}: Fake GPU (UUID: GPU-{i})'\n" for i in range(4)))
        path = fake + os.pathsep + os.environ.get("PATH", "")
        args = ["--num-ps", "1", "--num-workers", "4", "--bin-dir", BUILD_DIR, "--dry-run"]

        def cards(extra, visible):
            rc, out = run_in_process(args + extra, env={"PATH": path,
                                                        "CUDA_VISIBLE_DEVICES": visible})
            self.assertEqual(rc, 0, out)
            found = [re.search(r"CUDA_VISIBLE_DEVICES=(\S+) ", command_lines(out)[f"worker {k}"])
                     for k in range(4)]
            return [m.group(1) if m else None for m in found], out

        got, out = cards([], "2,3")
        self.assertEqual(got, ["2", "3", "2", "3"], out)
        self.assertIn("CUDA_VISIBLE_DEVICES=2,3 is set: trainer k on this host gets", out)
        got, out = cards(["--gpus-per-host", "1"], "GPU-b, GPU-a")
        self.assertEqual(got, ["GPU-b"] * 4, out)
        got, out = cards([], "")
        self.assertEqual(got, [None] * 4, out)
        self.assertIn("CUDA_VISIBLE_DEVICES is set and empty: trainers on this host get no GPU",
                      out)
        rc, out = run_in_process(args + ["--gpus-per-host", "3"],
                                 env={"CUDA_VISIBLE_DEVICES": "2,3"})
        self.assertEqual(rc, 2, out)
        self.assertIn("--gpus-per-host 3, but CUDA_VISIBLE_DEVICES=2,3 makes only 2 GPUs "
                      "visible", out)

    def test_gpu_flag_conflicts(self):
        rc, out = run_in_process(["--num-ps", "1", "--num-workers", "2", "--gpus-per-host", "2",
                                  "--dry-run", "--", "--gpu", "1"])
        self.assertEqual(rc, 2, out)
        self.assertIn("trainer flag --gpu conflicts with --gpus-per-host", out)


# An "ssh" that runs the command on this machine, in a new session (as a remote process would
# be: only the launcher's stdin pipe connects them), for hosts named node*; for hosts named
# slow* it appends its pid to $FAKE_SSH_PIDS and hangs; others are down.
LOCAL_SSH = textwrap.dedent("""\
    #!/bin/sh
    host=$1; shift
    case "$host" in
      node*) exec setsid -w sh -c "$*" ;;
      slow*) echo $$ >> "$FAKE_SSH_PIDS"; exec sleep 60 ;;
      *) echo "ssh: Could not resolve hostname $host: Name or service not known" >&2; exit 255 ;;
    esac
    """)


@unittest.skipUnless(os.access(PS_BIN, os.X_OK), f"ferry-ps not built under {BUILD_DIR}")
@unittest.skipUnless(shutil.which("setsid"), "setsid (util-linux) not installed")
class SshBackendTest(unittest.TestCase):
    """The ssh backend with an ssh command that stays on this machine (no root needed)."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-launch-test-")
        self.dir = self.tmp.name
        self.ssh = write_script(os.path.join(self.dir, "fake-ssh"), LOCAL_SSH)

    def tearDown(self):
        self.tmp.cleanup()

    def spec(self, data):
        path = os.path.join(self.dir, "spec.json")
        with open(path, "w") as f:
            json.dump(data, f)
        return path

    def test_unreachable_host_is_named(self):
        spec = self.spec({"ps": ["127.0.0.1:7000"], "worker": ["node-a", "gone.example"]})
        rc, out = run_launcher(["--spec", spec, "--bin-dir", BUILD_DIR, "--ssh", self.ssh])
        self.assertEqual(rc, 2, out)
        self.assertIn("preflight: host 'gone.example' (worker[1]) unreachable", out)
        self.assertIn("exit status 255: ssh: Could not resolve hostname gone.example", out)
        self.assertNotIn("node-a", out)
        self.assertNotIn("started", out)

    def test_missing_remote_binary_is_named(self):
        spec = self.spec({"ps": ["127.0.0.1:7000"], "worker": ["node-a"]})
        rc, out = run_launcher(["--spec", spec, "--bin-dir", BUILD_DIR, "--ssh", self.ssh,
                                "--remote-bin-dir", "/nonexistent/ferry"])
        self.assertEqual(rc, 2, out)
        self.assertIn("preflight: on host 'node-a' (worker[0]): binary not found or not "
                      "executable: /nonexistent/ferry/bin/ferry-trainer", out)

    def test_remote_worker_is_restarted(self):
        # A stub worker 1 on "node-b" that always fails: restarted once over ssh with --resume
        # (--max-restarts 1), then the job stops.
        bin_dir = make_stub_bin_dir(self.dir)
        spec = self.spec({"ps": [f"127.0.0.1:{free_ports(1)[0]}"], "worker": ["node-a", "node-b"]})
        rc, out = run_launcher(["--spec", spec, "--bin-dir", bin_dir, "--ssh", self.ssh,
                                "--grace", "1", "--max-restarts", "1", "--log-dir",
                                os.path.join(self.dir, "logs"), "--", "--stub-fail-rank", "1"],
                               timeout=30)
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, r"worker 1 on node-b \(ssh pid \d+\) died \(exit status 3\); "
                              "restarting it with --resume")
        self.assertRegex(out, r"restarted worker 1 on node-b \(ssh pid \d+\): \S+ferry-trainer "
                              r".* --num-workers 2 --resume --stub-fail-rank 1 --incarnation 1\n")
        runs = re.findall(r"\[worker 1\] stub trainer rank 1 pid (\d+) args (.*)", out)
        self.assertEqual(len(runs), 2, out)
        self.assertNotIn("'--resume'", runs[0][1])
        self.assertIn("'--resume'", runs[1][1])
        self.assertIn("worker 1 is not restarted: --max-restarts 1 allows no more restarts", out)
        stubs = [int(pid) for pid, _ in runs]
        stubs += [int(p) for p in re.findall(r"\[worker 0\] stub trainer rank 0 pid (\d+)", out)]
        wait_until_gone(stubs)
        self.assertEqual([p for p in stubs if pid_alive(p)], [], "stub trainers survived")

    def test_remote_worker_program_gets_its_environment(self):
        # Over ssh the environment travels in the command (env -u NAME ... NAME=VALUE) and
        # PYTHONPATH goes in front of the one the remote side has (here: what the fake ssh
        # inherits).
        bin_dir = make_program_bin_dir(self.dir)
        program, out_dir = write_worker_program(self.dir)
        port = free_ports(1)[0]
        spec = self.spec({"ps": [f"127.0.0.1:{port}"], "worker": ["127.0.0.1", "node-b:9000"]})
        rc, out = run_launcher(["--spec", spec, "--bin-dir", bin_dir, "--ssh", self.ssh,
                                "--gpus-per-host", "0", "--log-dir",
                                os.path.join(self.dir, "logs"), "--", sys.executable, program,
                                out_dir, "die-once"], timeout=60,
                               env={"PYTHONPATH": "/remote/lib", "FERRY_RESUME": "1"})
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"restarted worker 1 on node-b \(ssh pid \d+\): FERRY_INCARNATION=1 "
                              r"FERRY_NUM_WORKERS=2 FERRY_RANK=1 FERRY_RESUME=1 ")
        starts = program_starts(out_dir, 1)
        self.assertEqual([s["FERRY_RESUME"] for s in starts], [None, "1"], out)
        self.assertEqual(starts[0]["FERRY_SERVERS"], f"tcp://127.0.0.1:{port}")
        self.assertEqual(starts[0]["PYTHONPATH"], f"{bin_dir}/python:/remote/lib")
        self.assertEqual(json.loads(starts[0]["TF_CONFIG"]), {
            "cluster": {"ps": [f"127.0.0.1:{port}"], "worker": [f"127.0.0.1:{port + 1}",
                                                               "node-b:9000"]},
            "task": {"type": "worker", "index": 1}})
        # A program the remote side does not find: named before anything starts.
        spec = self.spec({"ps": [f"127.0.0.1:{port}"], "worker": ["node-a", "node-b"]})
        rc, out = run_launcher(["--spec", spec, "--bin-dir", bin_dir, "--ssh", self.ssh, "--",
                                "no-such-ferry-program", "--epochs", "1"])
        self.assertEqual(rc, 2, out)
        self.assertIn("preflight: on host 'node-a' (worker[0]): worker program "
                      "no-such-ferry-program: not found (a path to an executable file, or a "
                      "name on the PATH of a shell there)", out)
        self.assertIn("preflight: on host 'node-b' (worker[1]): worker program", out)
        self.assertNotIn("started", out)

    def test_sigterm_during_preflight_stops_the_checks(self):
        pids_file = os.path.join(self.dir, "ssh-pids")
        spec = self.spec({"ps": [f"127.0.0.1:{free_ports(1)[0]}"],
                          "worker": ["slow-a", "slow-b"]})
        r = Run(["--spec", spec, "--bin-dir", BUILD_DIR, "--ssh", self.ssh, "--ssh-timeout",
                 "50", "--log-dir", os.path.join(self.dir, "logs")],
                env={"FAKE_SSH_PIDS": pids_file})
        deadline = time.monotonic() + 10
        pids = []
        while len(pids) < 2 and time.monotonic() < deadline:  # both checks are running
            time.sleep(0.05)
            if os.path.exists(pids_file):
                with open(pids_file) as f:
                    pids = [int(p) for p in f.read().split()]
        self.assertEqual(len(pids), 2, r.output)
        r.proc.send_signal(signal.SIGTERM)
        self.assertEqual(r.finish(10), 128 + signal.SIGTERM, r.output)
        self.assertIn("stopped by SIGTERM before the cluster started", r.output)
        self.assertNotIn("Traceback", r.output)
        self.assertNotIn("started ps", r.output)
        wait_until_gone(pids)
        self.assertEqual([p for p in pids if pid_alive(p)], [], "ssh checks survived")

    def test_remote_processes_die_with_the_launcher(self):
        # SIGKILL leaves the launcher no chance: the remote wrappers see their stdin close.
        bin_dir = make_stub_bin_dir(self.dir)
        spec = self.spec({"ps": [f"127.0.0.1:{free_ports(1)[0]}"], "worker": ["node-a", "node-b"]})
        r = Run(["--spec", spec, "--bin-dir", bin_dir, "--ssh", self.ssh, "--grace", "1",
                 "--log-dir", os.path.join(self.dir, "logs"), "--", "--stub-ignore-term"])
        r.wait_for(r"\[worker 1\] stub trainer rank 1 pid \d+")
        r.wait_for(r"\[worker 0\] stub trainer rank 0 pid \d+")
        self.assertRegex(r.output, r"started worker 0 on node-a \(ssh pid \d+\): \S+ferry-trainer")
        r.proc.send_signal(signal.SIGKILL)
        self.assertEqual(r.finish(30), -signal.SIGKILL)
        pids = {f"worker {m.group(1)}": int(m.group(2)) for m in
                re.finditer(r"stub trainer rank (\d) pid (\d+)", r.output)}
        pids.update(parse_pids(r.output))  # ps 0, local
        self.assertEqual(sorted(pids), ["ps 0", "worker 0", "worker 1"], r.output)
        wait_until_gone(pids.values(), timeout=8)  # SIGTERM ignored: SIGKILL after 1 s
        alive = [f"{who} pid {pid}" for who, pid in pids.items() if pid_alive(pid)]
        self.assertEqual(alive, [], "processes survived the launcher")


def _ip(*args, check=True):
    r = subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {r.stderr.strip()}")
    return r.stdout


def _kill_netns_processes(name):
    for pid in _ip("netns", "pids", name, check=False).split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


class Namespaces:
    """N network namespaces on one bridge, each with an address from 198.18.0.0/15; the bridge
    holds .1 in this (root) namespace, so the launcher reaches every namespace and they reach
    each other. Names carry the test's pid; remove() deletes everything, and is safe to call
    after a partial setup; remove_stale() deletes what earlier runs, since dead, left behind."""

    # Every name this class makes, with the pid of the test process that made it.
    NAME_RE = re.compile(r"^(?:ferry-test-(\d+)-\d+|fbr(\d+)|fv(\d+)-\d+|fp(\d+)-\d+)$")

    @classmethod
    def stale(cls, name):
        """True for a name this class makes whose test process is gone."""
        m = cls.NAME_RE.match(name)
        return bool(m) and not pid_alive(int(next(g for g in m.groups() if g)))

    @classmethod
    def remove_stale(cls):
        """Deletes the namespaces (and processes in them), bridges and veths of earlier runs
        whose pid is dead: a run killed before tearDownClass (ctest's timeout) leaves them."""
        for line in _ip("netns", "list", check=False).splitlines():
            name = (line.split() or [""])[0]  # "NAME (id: 3)"
            if cls.stale(name):
                _kill_netns_processes(name)
                _ip("netns", "del", name, check=False)
        for line in _ip("-o", "link", "show", check=False).splitlines():
            fields = line.split(":")  # "12: fv123-0@if5: <BROADCAST,...> ..."
            name = fields[1].strip().split("@")[0] if len(fields) > 2 else ""
            if cls.stale(name):
                _ip("link", "del", name, check=False)

    def __init__(self, n=3):
        pid = os.getpid()
        self.names = [f"ferry-test-{pid}-{i}" for i in range(n)]
        self.bridge = f"fbr{pid}"
        self.veths = [f"fv{pid}-{i}" for i in range(n)]
        self.peers = [f"fp{pid}-{i}" for i in range(n)]
        self.created = []
        used = _ip("-4", "-o", "addr") + _ip("-4", "route")
        for k in range(512):  # a /24 of 198.18.0.0/15 this machine does not use yet
            x = (pid + k) % 512
            net = ipaddress.ip_network(f"198.{18 + x // 256}.{x % 256}.0/24")
            if f"{net.network_address}"[:-1] not in used:
                break
        self.prefix = str(net.network_address)[:-1]  # "198.18.X."
        self.gateway = self.prefix + "1"
        self.addresses = [f"{self.prefix}{11 + i}" for i in range(n)]

    def create(self):
        """Raises unittest.SkipTest when namespaces cannot be made here."""
        try:
            _ip("netns", "add", self.names[0])
        except (RuntimeError, OSError) as e:
            raise unittest.SkipTest(f"cannot create network namespaces: {e}") from None
        self.created.append(("netns", self.names[0]))
        try:
            for ns in self.names[1:]:
                _ip("netns", "add", ns)
                self.created.append(("netns", ns))
            _ip("link", "add", self.bridge, "type", "bridge")
            self.created.append(("link", self.bridge))
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for ns, veth, peer, addr in zip(self.names, self.veths, self.peers, self.addresses):
                _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
                self.created.append(("link", veth))
                _ip("link", "set", peer, "netns", ns)
                _ip("link", "set", veth, "master", self.bridge)
                _ip("link", "set", veth, "up")
                _ip("-n", ns, "link", "set", peer, "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except (RuntimeError, OSError) as e:
            self.remove()
            raise unittest.SkipTest(f"network namespace setup failed: {e}") from None
        self._probe()

    def _probe(self):
        """TCP from here and from namespace 0 to namespace 1, else skip (a firewall on the
        bridge, e.g. br_netfilter with a FORWARD drop policy, would make every test fail)."""
        server = ("import socket\ns = socket.socket(); s.bind((%r, 9)); s.listen()\n"
                  "print('up', flush=True)\nfor _ in range(2): s.accept()[0].close()\n"
                  % self.addresses[1])
        client = ("import socket, sys\nsocket.create_connection((%r, 9), timeout=3).close()\n"
                  % self.addresses[1])
        srv = subprocess.Popen(["ip", "netns", "exec", self.names[1], sys.executable, "-c",
                                server], stdout=subprocess.PIPE, text=True)
        try:
            ok = srv.stdout.readline().strip() == "up"
            ok = ok and subprocess.run([sys.executable, "-c", client], timeout=10).returncode == 0
            ok = ok and subprocess.run(["ip", "netns", "exec", self.names[0], sys.executable,
                                        "-c", client], timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            ok = False
        finally:
            srv.kill()
            srv.wait()
            srv.stdout.close()
        if not ok:
            self.remove()
            raise unittest.SkipTest("network namespaces made, but TCP between them is blocked "
                                    "(a firewall on the bridge?)")

    def pids(self):
        """{namespace: [pid, ...]} of the processes still inside each namespace."""
        out = {}
        for kind, name in self.created:
            if kind == "netns":
                out[name] = [int(p) for p in _ip("netns", "pids", name, check=False).split()]
        return out

    def kill_all(self):
        for kind, name in self.created:
            if kind == "netns":
                _kill_netns_processes(name)

    def remove(self):
        self.kill_all()
        for kind, name in reversed(self.created):
            if kind == "netns":
                _ip("netns", "del", name, check=False)
            else:  # deleting a namespace also deletes its veth peer, hence the check=False
                _ip("link", "del", name, check=False)
        self.created = []

    def ssh_script(self):
        """"ssh HOST CMD": CMD runs in HOST's namespace, in a new session (as it would on
        another machine, only the launcher's stdin pipe connects them); other hosts are down."""
        cases = "".join(f"  {a}) ns={n} ;;\n" for a, n in zip(self.addresses, self.names))
        return ("#!/bin/sh\nhost=$1; shift\ncase \"$host\" in\n" + cases +
                "  *) echo \"ssh: connect to host $host port 22: No route to host\" >&2; "
                "exit 255 ;;\nesac\n"
                "exec ip netns exec \"$ns\" setsid -w sh -c \"$*\"\n")


@unittest.skipUnless(os.access(PS_BIN, os.X_OK) and os.access(TRAINER_BIN, os.X_OK),
                     f"ferry-ps / ferry-trainer not built under {BUILD_DIR}")
class NetnsTest(unittest.TestCase):
    """The ssh backend across real (virtual) interfaces: three network namespaces."""

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root to create network namespaces (ip netns add)")
        if not shutil.which("ip") or not shutil.which("setsid"):
            raise unittest.SkipTest("needs ip (iproute2) and setsid (util-linux)")
        Namespaces.remove_stale()  # what runs killed before tearDownClass left behind
        cls.tmp = tempfile.TemporaryDirectory(prefix="ferry-launch-netns-")
        cls.ns = Namespaces(3)
        try:
            cls.ns.create()
        except BaseException:
            cls.tmp.cleanup()
            raise
        cls.ssh = write_script(os.path.join(cls.tmp.name, "netns-ssh"), cls.ns.ssh_script())

    @classmethod
    def tearDownClass(cls):
        cls.ns.remove()
        cls.tmp.cleanup()
        left = [n for n in cls.ns.names if n in _ip("netns", "list", check=False)]
        left += [l for l in [cls.ns.bridge] + cls.ns.veths
                 if subprocess.run(["ip", "link", "show", l], capture_output=True).returncode == 0]
        assert not left, f"left behind: {left}"

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="run-", dir=self.tmp.name)

    def tearDown(self):
        self.ns.kill_all()  # whatever a failed test left, so the next one starts clean

    def spec(self):
        a = self.ns.addresses
        path = os.path.join(self.dir, "spec.json")
        with open(path, "w") as f:
            json.dump({"ps": [f"{a[0]}:7470", f"{a[1]}:7471"], "worker": [a[1], a[2]]}, f)
        return path

    def assert_namespaces_empty(self):
        self.assertEqual({ns: pids for ns, pids in self.ns.pids().items() if pids}, {},
                         "processes left in the namespaces")

    def test_stale_namespaces_of_dead_runs_are_removed(self):
        dead = subprocess.Popen(["true"])
        dead.wait()  # a pid no test process has any more
        live = os.getpid()
        made = [("netns", f"ferry-test-{dead.pid}-0"), ("netns", f"ferry-test-{live}-9"),
                ("link", f"fbr{dead.pid}"), ("link", f"fv{dead.pid}-0")]
        try:
            _ip("netns", "add", made[0][1])
            _ip("netns", "add", made[1][1])
            _ip("link", "add", made[2][1], "type", "bridge")
            _ip("link", "add", made[3][1], "type", "veth", "peer", "name", f"fp{dead.pid}-0")
            Namespaces.remove_stale()
            netns = _ip("netns", "list")
            links = _ip("-o", "link", "show")
            self.assertNotIn(made[0][1], netns)
            self.assertNotRegex(links, rf": (fbr|fv|fp){dead.pid}[-:@]")
            self.assertIn(made[1][1], netns)  # its test process (this one) is alive
        finally:
            for kind, name in made:
                _ip(kind, "del", name, check=False)

    def test_cluster_across_namespaces_trains(self):
        a = self.ns.addresses
        rc, out = run_launcher(["--spec", self.spec(), "--ssh", self.ssh, "--bin-dir", BUILD_DIR,
                                "--gpus-per-host", "0", "--log-dir",
                                os.path.join(self.dir, "logs"), "--"] + SHORT_TRAINING)
        self.assertEqual(rc, 0, out)
        self.assertIn(f"[ps 0] ferry-ps rank 0 of 2 listening on tcp://{a[0]}:7470", out)
        self.assertIn(f"started worker 1 on {a[2]} (ssh pid", out)
        self.assertIn(f"--servers tcp://{a[0]}:7470,tcp://{a[1]}:7471", out)
        self.assertRegex(out, r"\[worker 0\] done: 20 steps")
        self.assertRegex(out, r"\[worker 1\] done: 20 steps")
        self.assert_namespaces_empty()

    def test_failing_remote_worker_stops_everything(self):
        bin_dir = make_stub_bin_dir(self.dir)
        r = Run(["--spec", self.spec(), "--ssh", self.ssh, "--bin-dir", bin_dir, "--grace", "1",
                 "--max-restarts", "0", "--log-dir", os.path.join(self.dir, "logs"), "--no-curve", "--",
                 "--stub-fail-rank", "1", "--stub-ignore-term"])
        rc = r.finish(60)
        out = r.output
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, rf"FAILED: worker 1 on {re.escape(self.ns.addresses[2])} "
                              r"\(ssh pid \d+\) failed: exit status 3")
        self.assertIn("stub: failing on purpose", out.split("FAILED:")[1])
        # worker 0 ignored SIGTERM: the wrapper on its host sent SIGKILL after the grace.
        self.assertRegex(out, r"\[worker 0\] ferry-launch: \S+ferry-trainer on \S+ ignored "
                              "SIGTERM; sent SIGKILL")
        stubs = {int(p) for p in re.findall(r"stub trainer rank \d pid (\d+)", out)}
        self.assertEqual(len(stubs), 2, out)
        self.assertFalse([p for p in stubs if pid_alive(p)], "stub trainers survived")
        self.assert_namespaces_empty()


# A stand-in for srun inside an allocation: runs the step's tasks on this machine, placed as
# SLURM_HOSTFILE says (--distribution=arbitrary), with SLURM_PROCID, SLURM_LOCALID,
# SLURM_NODEID and SLURMD_NODENAME set, output labelled "N: " (--label) and its stdin copied to
# every task (--input=all). Like srun, SIGTERM kills the tasks. Writes its options and command
# to $FAKE_SRUN_ARGS.
FAKE_SRUN = textwrap.dedent(f"""\
    #!{sys.executable}
    import json, os, signal, subprocess, sys, threading
    args = sys.argv[1:]
    opts = {{}}
    while args and args[0].startswith("--"):
        k, _, v = args.pop(0)[2:].partition("=")
        opts[k] = v
    with open(os.environ["FAKE_SRUN_ARGS"], "w") as f:
        json.dump({{"opts": opts, "cmd": args}}, f)
    with open(os.environ["SLURM_HOSTFILE"]) as f:
        hosts = f.read().replace(",", " ").split()
    if (opts.get("distribution") != "arbitrary" or "label" not in opts
            or opts.get("input") != "all" or int(opts["ntasks"]) != len(hosts)):
        sys.exit(f"fake srun: unexpected options {{opts}} for hosts {{hosts}}")
    nodes = list(dict.fromkeys(hosts))
    procs = []
    for rank, host in enumerate(hosts):
        env = dict(os.environ, SLURM_PROCID=str(rank), SLURM_LOCALID=str(hosts[:rank].count(host)),
                   SLURM_NODEID=str(nodes.index(host)), SLURMD_NODENAME=host, SLURM_STEP_ID="0")
        procs.append(subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, env=env))
    lock = threading.Lock()
    def pump(rank, p):
        for line in p.stdout:
            with lock:
                sys.stdout.buffer.write(f"{{rank}}: ".encode() + line)
                sys.stdout.flush()
    def feed():
        while True:
            data = os.read(0, 65536)
            if not data:
                break
            for p in procs:
                try:
                    p.stdin.write(data)
                    p.stdin.flush()
                except OSError:
                    pass
        for p in procs:
            try:
                p.stdin.close()
            except OSError:
                pass
    def kill(*_):
        for p in procs:
            p.kill()
    signal.signal(signal.SIGTERM, kill)
    readers = [threading.Thread(target=pump, args=(r, p)) for r, p in enumerate(procs)]
    for t in readers:
        t.start()
    threading.Thread(target=feed, daemon=True).start()
    codes = [p.wait() for p in procs]
    for t in readers:
        t.join()
    for rank, c in enumerate(codes):
        if c:
            print(f"srun: error: {{hosts[rank]}}: task {{rank}}: Exited with exit code {{c}}",
                  flush=True)
    sys.exit(max(c if c >= 0 else 128 - c for c in codes))
    """)


class SlurmTest(unittest.TestCase):
    """The Slurm backend: node list parsing, the srun command, and runs through a fake srun.
    The nodes are 127.0.0.1 and 127.0.0.2, both loopback addresses of this machine."""

    NODELIST = "127.0.0.[1-2]"

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-launch-test-")
        self.dir = self.tmp.name
        self.srun = write_script(os.path.join(self.dir, "fake-srun"), FAKE_SRUN)
        self.srun_args = os.path.join(self.dir, "srun-args.json")

    def tearDown(self):
        self.tmp.cleanup()

    def env(self, **extra):
        return dict({"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": self.NODELIST,
                     "FAKE_SRUN_ARGS": self.srun_args}, **extra)

    def test_hostlist_parser(self):
        expand = load_launcher_module().expand_hostlist
        self.assertEqual(expand("node[01-03,07],gpu-a1"),
                         ["node01", "node02", "node03", "node07", "gpu-a1"])
        self.assertEqual(expand("n[8-10]"), ["n8", "n9", "n10"])
        self.assertEqual(expand("n[08-10]"), ["n08", "n09", "n10"])
        self.assertEqual(expand("r[1-2]n[1-2],solo"), ["r1n1", "r1n2", "r2n1", "r2n2", "solo"])
        self.assertEqual(expand("a,b,a"), ["a", "b"])
        self.assertEqual(expand("127.0.0.[1-2]"), ["127.0.0.1", "127.0.0.2"])
        self.assertEqual(expand("x[5]"), ["x5"])
        for bad, why in [("node[1-3", "'[' without ']'"), ("node1-3]", "']' without '['"),
                         ("n[3-1]", "runs backwards"), ("n[a-b]", "bad range 'a-b'"),
                         ("a,,b", "empty host name"), ("n[[1]]", "nested '['")]:
            with self.subTest(bad=bad):
                with self.assertRaises(Exception) as cm:
                    expand(bad)
                self.assertIn(why, str(cm.exception))
                self.assertIn(f"SLURM_JOB_NODELIST '{bad}'", str(cm.exception))

    def test_dry_run_prints_the_srun_step(self):
        # No --slurm: SLURM_JOB_ID without --spec picks the backend, and says so.
        r = Run(["--num-ps", "2", "--num-workers", "3", "--base-port", "7470",
                 "--gpus-per-host", "2", "--srun", "srun --overcommit", "--bin-dir", BUILD_DIR,
                 "--dry-run", "--", "--steps", "5"], env=self.env())
        rc, out = r.finish(30), r.output
        self.assertEqual(rc, 0, out)
        self.assertIn("Slurm backend (SLURM_JOB_ID=4242 is set and no --spec was given", out)
        cmds = command_lines(out)
        self.assertRegex(cmds["srun"], r"^SLURM_HOSTFILE=\S+/slurm-hostfile srun --overcommit "
                                       r"--ntasks=5 --nodes=2 --distribution=arbitrary --label "
                                       r"--input=all \S+/launch/ferry-launch --slurm-task ")
        self.assertIn(""""ps":["127.0.0.1:7470","127.0.0.2:7471"]""", cmds["srun"])
        self.assertTrue(cmds["srun"].endswith(" -- --steps 5"), cmds["srun"])
        self.assertEqual(cmds["hostfile"], "127.0.0.1,127.0.0.2,127.0.0.1,127.0.0.2,127.0.0.1")
        self.assertIn("(slurm task 1 on 127.0.0.2)", cmds["ps 1"])
        self.assertIn("--bind tcp://127.0.0.2:7471", cmds["ps 1"])
        # One card per trainer on each node: node .1 has workers 0 and 2, node .2 worker 1.
        for who, card in (("worker 0", "0"), ("worker 1", "0"), ("worker 2", "1")):
            self.assertIn(f"CUDA_VISIBLE_DEVICES={card} ", cmds[who])
        # --no-slurm: back to local processes.
        rc, out = run_in_process(["--num-ps", "1", "--num-workers", "1", "--no-slurm",
                                  "--gpus-per-host", "0", "--dry-run"], env=self.env())
        self.assertEqual(rc, 0, out)
        self.assertNotIn("srun", out)

    @unittest.skipUnless(os.access(PS_BIN, os.X_OK) and os.access(TRAINER_BIN, os.X_OK),
                         f"ferry-ps / ferry-trainer not built under {BUILD_DIR}")
    def test_step_trains_and_exits_zero(self):
        logs = os.path.join(self.dir, "logs")
        rc, out = run_launcher(["--slurm", "--srun", self.srun, "--num-ps", "2",
                                "--num-workers", "2", "--base-port", "0", "--gpus-per-host", "0",
                                "--ps-arg", "--max-wait-s 30", "--bin-dir", BUILD_DIR,
                                "--log-dir", logs, "--"] + SHORT_TRAINING, env=self.env())
        self.assertEqual(rc, 0, out)
        self.assertIn("Slurm backend (--slurm)", out)
        self.assertRegex(out, r"\[ps 1\] ferry-launch: started ps 1 pid \d+: .* --max-wait-s 30")
        self.assertRegex(out, r"rendezvous: all 4 tasks of the step running")
        self.assertRegex(out, r"\[ps 1\] ferry-launch: slurm task 1 is ps 1 on 127\.0\.0\.2 "
                              r"\(SLURM_NODEID 1, SLURM_LOCALID 0\)")
        self.assertRegex(out, r"\[ps 1\] ferry-ps rank 1 of 2 listening on tcp://127\.0\.0\.2:")
        self.assertIn("[worker 0] ferry-launch: rendezvous: all 2 servers up", out)
        self.assertRegex(out, r"\[worker 0\] done: 20 steps")
        self.assertRegex(out, r"\[worker 1\] done: 20 steps")
        self.assertIn("done: 2 workers finished, 2 servers stopped", out)
        with open(self.srun_args) as f:
            self.assertEqual(json.load(f)["opts"]["ntasks"], "4")
        self.assertEqual(sorted(os.listdir(logs)), ["ps-0.log", "ps-1.log", "slurm-hostfile",
                                                    "srun.log", "worker-0.log", "worker-1.log"])
        self.assert_gone(out)

    @unittest.skipUnless(os.access(PS_BIN, os.X_OK), f"ferry-ps not built under {BUILD_DIR}")
    def test_failing_task_stops_the_step(self):
        bin_dir = make_stub_bin_dir(self.dir)
        rc, out = run_launcher(["--slurm", "--srun", self.srun, "--num-ps", "2",
                                "--num-workers", "2", "--base-port", "0", "--grace", "1",
                                "--gpus-per-host", "0", "--bin-dir", bin_dir,
                                "--log-dir", os.path.join(self.dir, "logs"), "--",
                                "--stub-fail-rank", "1", "--stub-ignore-term"], env=self.env())
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, r"FAILED: worker 1 \(slurm task 3 on 127\.0\.0\.2\) failed: "
                              r"exit status 3")
        self.assertIn("stub: failing on purpose", out.split("FAILED:")[1])
        self.assertRegex(out, r"\[worker 0\] ferry-launch: worker 0 pid \d+ ignored SIGTERM")
        self.assert_gone(out)

    @unittest.skipUnless(os.access(PS_BIN, os.X_OK), f"ferry-ps not built under {BUILD_DIR}")
    def test_worker_program_runs_in_the_step(self):
        # Each task builds its process's environment on its node (srun passes the launcher's
        # on): the same contract as the local backend.
        bin_dir = make_program_bin_dir(self.dir)
        program, out_dir = write_worker_program(self.dir)
        rc, out = run_launcher(["--slurm", "--srun", self.srun, "--num-ps", "2",
                                "--num-workers", "2", "--base-port", "0", "--gpus-per-host", "0",
                                "--bin-dir", bin_dir, "--log-dir", os.path.join(self.dir, "logs"),
                                "--", sys.executable, program, out_dir, "ok"],
                               env=self.env(PYTHONPATH="/inherited", FERRY_RESUME="1"))
        self.assertEqual(rc, 0, out)
        with open(self.srun_args) as f:
            self.assertEqual(json.load(f)["cmd"][-4:], [sys.executable, program, out_dir, "ok"])
        servers = listening(out)
        self.assertEqual(sorted(servers), ["ps 0", "ps 1"], out)
        for rank in range(2):
            seen = program_starts(out_dir, rank)[0]
            self.assertEqual(seen["FERRY_SERVERS"], f"{servers['ps 0']},{servers['ps 1']}")
            self.assertEqual((seen["FERRY_RANK"], seen["FERRY_NUM_WORKERS"], seen["FERRY_RESUME"]),
                             (str(rank), "2", None))
            self.assertEqual(seen["PYTHONPATH"], f"{bin_dir}/python:/inherited")
            self.assertEqual(json.loads(seen["TF_CONFIG"])["task"],
                             {"type": "worker", "index": rank})
        self.assertIn("done: 2 workers finished, 2 servers stopped", out)

    def test_base_port_zero_needs_nodes_of_this_machine(self):
        rc, out = run_in_process(["--num-ps", "2", "--num-workers", "2", "--base-port", "0",
                                  "--dry-run"], env=self.env(SLURM_JOB_NODELIST="gpu[1-2]"))
        self.assertEqual(rc, 2, out)
        self.assertIn("--base-port 0 picks ports free on this machine, but SLURM_JOB_NODELIST "
                      "puts a server on gpu1; give a port (e.g. --base-port 7470)", out)

    def test_ps_args_reach_the_step(self):
        rc, out = run_in_process(["--num-ps", "1", "--num-workers", "1", "--gpus-per-host", "0",
                                  "--ps-arg", "--max-wait-s 30", "--dry-run"], env=self.env())
        self.assertEqual(rc, 0, out)
        cmds = command_lines(out)
        self.assertIn(" '--ps-arg=--max-wait-s 30' -- ", cmds["srun"] + " ")
        self.assertTrue(cmds["ps 0"].endswith("--compute-threads 1 --metrics 127.0.0.1:0 --num-workers 1 --max-wait-s 30"), cmds)

    @unittest.skipUnless(os.access(PS_BIN, os.X_OK), f"ferry-ps not built under {BUILD_DIR}")
    def test_step_that_never_starts_times_out(self):
        # srun waiting for resources starts no task: the launcher's deadline still holds. (The
        # note comes at 3 s, the deadline 2.5 s later. With 3.5 s, a launcher woken 0.5 s late
        # on a loaded machine would time out without the note: the likely cause of this class
        # failing once in a full parallel run, whose output was lost.)
        srun = write_script(os.path.join(self.dir, "pending-srun"), textwrap.dedent("""\
            #!/bin/sh
            echo "srun: job 4242 queued and waiting for resources"
            exec cat >/dev/null
            """))
        t0 = time.monotonic()
        rc, out = run_launcher(["--slurm", "--srun", srun, "--num-ps", "1", "--num-workers",
                                "1", "--base-port", "0", "--gpus-per-host", "0",
                                "--rendezvous-timeout", "5.5", "--bin-dir", BUILD_DIR,
                                "--log-dir", os.path.join(self.dir, "logs")], env=self.env())
        self.assertEqual(rc, 1, out)
        self.assertLess(time.monotonic() - t0, 15)
        self.assertIn("[srun] srun: job 4242 queued and waiting for resources", out)
        self.assertIn("waiting for the srun step, 3 s: not started by srun yet (waiting for "
                      "resources?): ps 0 (slurm task 0 on 127.0.0.1), worker 0 (slurm task 1 on "
                      "127.0.0.1)", out)
        self.assertIn("rendezvous timed out after 5.5 s: not started by srun yet", out)
        self.assertIn("stopping the srun step (rendezvous timed out)", out)

    def test_srun_output_is_split_per_task(self):
        fl = load_launcher_module()
        cluster = fl.cluster_from_nodes(["a", "b"], 1, 2, 7000)  # tasks: ps 0, worker 0, 1
        opts = unittest.mock.Mock(log_dir=self.dir, grace=1.0)
        sl = fl.SlurmLauncher(cluster, opts, fl.Console(), fl.StopSignals(), ["srun"],
                              "hostfile")
        sl.streams = [fl.Stream(t.name, os.path.join(self.dir, f"{i}.log"), sl.console)
                      for i, t in enumerate(sl.tasks)]
        sl.srun_stream = fl.Stream("srun", os.path.join(self.dir, "srun.log"), sl.console)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            for line in ["0: ferry-ps rank 0 of 1 listening", " 1: training...",
                         "1: ferry-launch: worker 0 ended: exit status 3 [task-exit 3]",
                         "srun: error: b: tasks 2: Killed", "srun: Job step aborted"]:
                sl._on_line(line)
        self.assertEqual(out.getvalue().splitlines(), [
            "[ps 0] ferry-ps rank 0 of 1 listening", "[worker 0] training...",
            "[worker 0] ferry-launch: worker 0 ended: exit status 3 [task-exit 3]",
            "[srun] srun: error: b: tasks 2: Killed", "[srun] srun: Job step aborted"])
        self.assertEqual(sl.rc, [None, 3, -signal.SIGKILL])
        self.assertEqual([sl.events.get_nowait() for _ in range(2)], [("task", 1), ("task", 2)])
        for stream in sl.streams + [sl.srun_stream]:
            stream.close()
        with open(os.path.join(self.dir, "1.log")) as f:
            self.assertEqual(f.read().splitlines()[0], "training...")

    @unittest.skipUnless(os.access(PS_BIN, os.X_OK), f"ferry-ps not built under {BUILD_DIR}")
    def test_sigkill_to_launcher_ends_the_step(self):
        # srun gets SIGTERM when the launcher dies (Slurm then kills the step; the fake srun
        # kills its tasks), and each task's process dies with its task.
        bin_dir = make_stub_bin_dir(self.dir)
        r = Run(["--slurm", "--srun", self.srun, "--num-ps", "2", "--num-workers", "2",
                 "--base-port", "0", "--gpus-per-host", "0", "--bin-dir", bin_dir,
                 "--log-dir", os.path.join(self.dir, "logs"), "--", "--stub-ignore-term"],
                env=self.env())
        for pattern in (r"\[worker 1\] stub trainer rank 1 pid", r"started worker 1 pid",
                        r"\[worker 0\] stub trainer rank 0 pid", r"started worker 0 pid"):
            r.wait_for(pattern)
        r.proc.send_signal(signal.SIGKILL)
        self.assertEqual(r.finish(30), -signal.SIGKILL)
        pids = parse_pids(r.output)
        pids.update({f"stub {m.group(1)}": int(m.group(2)) for m in
                     re.finditer(r"stub trainer rank (\d) pid (\d+)", r.output)})
        self.assertEqual(len(pids), 6, r.output)  # ps 0, ps 1, worker 0, worker 1 (= stubs)
        wait_until_gone(pids.values())
        alive = [f"{who} pid {pid}" for who, pid in pids.items() if pid_alive(pid)]
        self.assertEqual(alive, [], "processes survived the launcher")

    def assert_gone(self, out):
        pids = parse_pids(out)  # "[ps 0] ferry-launch: started ps 0 pid N" from each task
        pids.update({f"stub {m.group(1)}": int(m.group(2)) for m in
                     re.finditer(r"stub trainer rank (\d) pid (\d+)", out)})
        self.assertEqual(sorted(k for k in pids if k.startswith(("ps", "worker"))),
                         ["ps 0", "ps 1", "worker 0", "worker 1"], out)
        alive = [f"{who} pid {pid}" for who, pid in pids.items() if pid_alive(pid)]
        self.assertEqual(alive, [], "processes survived the launcher")


# CURVE (--curve, --curve-keys). Stand-ins that need no CURVE support from the C++ side: a ferry-ps
# that listens on its --bind port and sleeps; a ferry-trainer that exits 0, except rank R under
# --stub-fail-once-rank R, which exits 3 unless it runs with --resume; and a ferry-keys that
# keeps the real one's contract (DIR created mode 0700, its parent must exist; exit 2 if DIR
# holds a key file already; files mode 0600), appends its argv to $FERRY_STUB_KEYS_LOG (JSON
# lines), and fails on purpose when FERRY_STUB_KEYS_FAIL=1.
STUB_LISTENING_PS = textwrap.dedent(f"""\
    #!{sys.executable}
    import os, re, socket, sys, time
    argv = sys.argv[1:]
    host, port = re.fullmatch(r"tcp://(.+):(\\d+)", argv[argv.index("--bind") + 1]).groups()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    s.listen()
    print(f"stub ps rank {{argv[argv.index('--rank') + 1]}} pid {{os.getpid()}} args {{argv}}",
          flush=True)
    time.sleep(120)
    """)
STUB_FINISHING_TRAINER = textwrap.dedent(f"""\
    #!{sys.executable}
    import os, sys, time
    argv = sys.argv[1:]
    rank = argv[argv.index("--rank") + 1]
    print(f"stub trainer rank {{rank}} pid {{os.getpid()}} args {{argv}}", flush=True)
    if ("--stub-fail-once-rank" in argv and argv[argv.index("--stub-fail-once-rank") + 1] == rank
            and "--resume" not in argv):
        time.sleep(0.2)
        print("stub: failing on purpose", flush=True)
        sys.exit(3)
    """)
STUB_KEYS = textwrap.dedent(f"""\
    #!{sys.executable}
    import json, os, sys
    argv = sys.argv[1:]
    if os.environ.get("FERRY_STUB_KEYS_LOG"):
        with open(os.environ["FERRY_STUB_KEYS_LOG"], "a") as f:
            f.write(json.dumps(argv) + "\\n")
    if os.environ.get("FERRY_STUB_KEYS_FAIL") == "1":
        sys.exit("ferry-keys: failing on purpose")
    folder, n = argv[0], int(argv[argv.index("--workers") + 1])
    names = ["server.key", "server.pub", "workers.pub"] + [f"worker-{{r}}.key" for r in range(n)]
    if "--readers" in argv:
        m = int(argv[argv.index("--readers") + 1])
        names += ["readers.pub"] + [f"reader-{{r}}.key" for r in range(m)]
    if not os.path.isdir(folder):
        os.mkdir(folder, 0o700)
    if any(os.path.exists(os.path.join(folder, x)) for x in names):
        sys.exit(f"ferry-keys: {{folder}} already holds keys: existing keys are never overwritten")
    for x in names:
        fd = os.open(os.path.join(folder, x), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"stub key\\n")
        os.close(fd)
    print(f"ferry-keys: wrote the keys of a job of {{n}} worker(s) to {{folder}}", flush=True)
    """)
KEY_FILES_2 = ["server.key", "server.pub", "workers.pub", "worker-0.key", "worker-1.key"]


def make_key_folder(folder, names=KEY_FILES_2):
    os.makedirs(folder, mode=0o700)
    for name in names:
        fd = os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
    return folder


def key_folders(argv):
    """The values of --curve-keys in argv (a list of words)."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == "--curve-keys"]


def started_commands(output):
    """{name: [command, ...]} from the launcher's "started/restarted NAME pid N: COMMAND" lines
    (local processes; Slurm tasks' "[ps 0] ferry-launch: started ps 0 pid N: ..." too)."""
    found = collections.defaultdict(list)
    for m in re.finditer(r"(?:re)?started (\w+ \d+) (?:pid \d+|on \S+ \(ssh pid \d+\)): (.*)$",
                         output, re.M):
        found[m.group(1)].append(m.group(2))
    return dict(found)


class CurveTest(unittest.TestCase):
    """--curve and --curve-keys with stand-ins for ferry-ps, ferry-trainer and ferry-keys (no
    CURVE support needed from the binaries): the flags every command gets, usage errors, the
    key folder's preflight, the exposure warning, and the key folder --curve makes."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-launch-test-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def stub_bins(self, keys=True):
        """A flat bin dir of stand-ins: ferry-ps, ferry-trainer and (keys) ferry-keys."""
        d = os.path.join(self.dir, "bin")
        os.makedirs(d, exist_ok=True)
        write_script(os.path.join(d, "ferry-ps"), STUB_LISTENING_PS)
        write_script(os.path.join(d, "ferry-trainer"), STUB_FINISHING_TRAINER)
        if keys:
            write_script(os.path.join(d, "ferry-keys"), STUB_KEYS)
        return d

    def keys_log(self):
        path = os.path.join(self.dir, "ferry-keys-calls")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [json.loads(line) for line in f]

    def assert_stubs_gone(self, out):
        pids = [int(p) for p in re.findall(r"stub (?:ps|trainer) rank \d+ pid (\d+)", out)]
        pids += [pid for _, pid in all_pids(out)]
        self.assertTrue(pids, out)
        wait_until_gone(pids)
        self.assertEqual([p for p in pids if pid_alive(p)], [], "stand-ins survived")

    def test_every_command_gets_the_key_folder(self):
        keys = os.path.join(self.dir, "keys")
        logs = os.path.join(self.dir, "logs")
        dry = ["--num-ps", "2", "--num-workers", "2", "--base-port", "7470", "--gpus-per-host",
               "0", "--bin-dir", BUILD_DIR, "--dry-run", "--", "--steps", "5"]
        for extra, want in [(["--curve-keys", keys], keys),
                            (["--curve-keys", os.path.relpath(keys)], keys),  # made absolute
                            (["--curve", "--log-dir", logs], os.path.join(logs, "keys")),
                            (["--curve"], os.path.join("LOG_DIR", "keys")),  # a temp dir later
                            ([], None)]:
            with self.subTest(extra=extra):
                rc, out = run_in_process(extra + dry)
                self.assertEqual(rc, 0, out)
                cmds = command_lines(out)
                for who in ("ps 0", "ps 1", "worker 0", "worker 1"):
                    self.assertEqual(key_folders(shlex.split(cmds[who])), [want] if want else [],
                                     cmds[who])
                if want:
                    self.assertTrue(cmds["worker 1"].endswith(f"--num-workers 2 --metrics 127.0.0.1:0 --curve-keys "
                                                              f"{want} --steps 5"), cmds)
                else:
                    self.assertNotIn("--curve", out)
                self.assertEqual("--curve:" in out, "--curve" in extra, out)
                self.assertFalse(os.path.exists(logs))  # a dry run creates nothing
        # Restarts: a worker's --resume command and a server's --restore command keep it.
        fl = load_launcher_module()
        for extra in (["--curve-keys", keys], []):
            with self.subTest(restarts=extra):
                _, opts = fl.cli.parse_args(["--num-ps", "2", "--num-workers", "3",
                                             "--checkpoint-dir", os.path.join(self.dir, "ckpt")]
                                            + extra + ["--", "--steps", "5"])
                cluster = fl.spec.cluster_from_flags(opts)
                fl.commands.build_commands(cluster, fl.commands.Binaries(BUILD_DIR), opts,
                                           lambda t: [])
                for t in cluster.tasks:
                    for argv in (t.argv, t.resume_argv):
                        self.assertEqual(key_folders(argv), [keys] if extra else [], argv)
                    self.assertIn("--restore" if t.role == "ps" else "--resume", t.resume_argv)
        # Slurm: the step's tasks get --curve-keys and pass it on to their process.
        slurm = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "127.0.0.[1-2]"}
        rc, out = run_in_process(["--num-ps", "1", "--num-workers", "2", "--gpus-per-host", "0",
                                  "--curve-keys", keys, "--dry-run"], env=slurm)
        self.assertEqual(rc, 0, out)
        cmds = command_lines(out)
        self.assertIn(f" --curve-keys {keys} -- ", cmds["srun"] + " ")
        for who in ("ps 0", "worker 0", "worker 1"):
            self.assertEqual(key_folders(shlex.split(cmds[who].split(") ", 1)[1])), [keys])

    def test_usage_errors(self):
        keys = os.path.join(self.dir, "keys")
        base = ["--num-ps", "1", "--num-workers", "2", "--gpus-per-host", "0", "--dry-run"]
        for extra, want in [
                (["--curve", "--curve-keys", keys],
                 "--curve and --curve-keys DIR are exclusive (--curve makes new keys for the job; "
                 "--curve-keys DIR uses the keys in DIR)"),
                (["--curve-keys", ""], "argument --curve-keys: empty folder name"),
                (["--ps-arg", f"--curve-keys {keys}"],
                 "--ps-arg flag --curve-keys is set by the launcher; remove it (use --curve or "
                 "--curve-keys DIR)"),
                (["--curve", "--", f"--curve-keys={keys}"],
                 f"trainer flag --curve-keys={keys} is set by the launcher; remove it (use "
                 "--curve or --curve-keys DIR)")]:
            with self.subTest(extra=extra):
                rc, out = run_in_process(base + extra)
                self.assertEqual(rc, 2, out)
                self.assertIn(want, out)
                self.assertNotIn("[ps 0]", out)

    def test_key_folder_preflight_names_what_is_wrong(self):
        bin_dir = self.stub_bins()
        logs = os.path.join(self.dir, "logs")
        keys = os.path.join(self.dir, "keys")
        args = ["--num-ps", "1", "--num-workers", "2", "--base-port", "0", "--gpus-per-host",
                "0", "--bin-dir", bin_dir, "--log-dir", logs, "--curve-keys", keys]

        def error(want):
            rc, out = run_in_process(args)
            self.assertEqual(rc, 2, out)
            self.assertIn(f"ferry-launch: error: --curve-keys {keys}: {want}", out)
            self.assertNotIn("started", out)
            self.assertFalse(os.path.exists(logs))  # refused before the log dir is made

        error("no such folder (ferry-keys DIR --workers 2 makes a job's key folder)")
        make_key_folder(keys, [n for n in KEY_FILES_2 if n != "worker-1.key"])
        error("missing key file worker-1.key (worker 1's keypair); a job of 2 workers needs "
              "server.key, server.pub, workers.pub and worker-R.key for every worker R "
              "(`ferry-keys DIR --workers 2` makes them)")
        os.remove(os.path.join(keys, "server.pub"))
        error("missing key files server.pub (the servers' public key, read by every worker), "
              "worker-1.key (worker 1's keypair);")
        for name in ("server.pub", "worker-1.key"):
            os.close(os.open(os.path.join(keys, name), os.O_WRONLY | os.O_CREAT, 0o600))
        os.chmod(os.path.join(keys, "worker-0.key"), 0o640)
        error("secret key worker-0.key (mode 0640) open to group or others: chmod 600 "
              "(ferry-ps and ferry-trainer refuse such a key)")
        os.chmod(os.path.join(keys, "worker-0.key"), 0o600)
        fl = load_launcher_module()  # a whole folder passes
        _, opts = fl.cli.parse_args(args)
        fl.curve.check_key_folder(keys, fl.spec.cluster_from_flags(opts).tasks, 2)

    def test_curve_is_the_default_where_servers_are_exposed(self):
        # Servers other machines can reach (a host name binds every interface; an address other
        # than loopback) get CURVE without being asked: the launcher makes the job's keys, and
        # every command gets the folder. --no-curve runs without it, with a warning.
        dry = ["--num-workers", "1", "--gpus-per-host", "0", "--bin-dir", BUILD_DIR, "--dry-run"]
        spec = os.path.join(self.dir, "spec.json")
        with open(spec, "w") as f:
            json.dump({"ps": ["10.0.0.1:7000", "127.0.0.1:7001"], "worker": ["127.0.0.1"]}, f)
        exposed = {
            "host name": (["--num-ps", "2", "--host", "node5"] + dry,
                          "ps 0 at 0.0.0.0:7470 (every interface), ps 1 at 0.0.0.0:7471 (every "
                          "interface)", "those ports"),
            "address": (["--spec", spec] + dry[2:], "ps 0 at 10.0.0.1:7000", "that port"),
        }
        for what, (args, where, ports) in exposed.items():
            with self.subTest(what=what):
                rc, out, err = run_in_process_split(args)
                self.assertEqual(rc, 0, out + err)
                self.assertIn(f"ferry-launch: servers listen on addresses other machines can reach "
                              f"({where}): CURVE is on, with keys the launcher makes for the job (as "
                              "--curve; --curve-keys DIR gives them, --no-curve runs without)\n", out)
                self.assertIn("--curve: ", out)  # the keys it would make
                for cmd in command_lines(out).values():
                    self.assertIn(f"--curve-keys {os.path.join('LOG_DIR', 'keys')}", cmd)
                self.assertNotIn("warning", out + err)
                rc, out, err = run_in_process_split(args + ["--no-curve"])
                self.assertEqual(rc, 0, out + err)
                self.assertEqual(err.count("warning"), 1, err)
                self.assertIn("ferry-launch: warning: --no-curve: servers listen without CURVE on "
                              f"addresses other machines can reach: {where}. Anyone who can reach "
                              f"{ports} can read and change the model and stop the job: leave CURVE "
                              "on (without --no-curve the launcher makes the job's keys), or restrict "
                              "the network so that only the job's hosts reach them (see "
                              "launch/README.md)\n", err)
                self.assertNotIn("--curve-keys", out)
                for curve in (["--curve"], ["--curve-keys", os.path.join(self.dir, "keys")]):
                    rc, out, err = run_in_process_split(args + curve)
                    self.assertEqual(rc, 0, out + err)
                    self.assertNotIn("warning", out + err)
                    self.assertNotIn("CURVE is on", out)
        for host in ("127.0.0.1", "localhost", "127.0.0.5"):  # loopback only: no CURVE, no warning
            rc, out, err = run_in_process_split(["--num-ps", "2", "--host", host] + dry)
            self.assertEqual(rc, 0, out + err)
            self.assertNotIn("warning", out + err)
            self.assertNotIn("--curve", out)
        # Slurm: nodes by name bind 0.0.0.0.
        for nodes, exposed_nodes in (("gpu[1-2]", True), ("127.0.0.[1-2]", False)):
            env = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": nodes}
            rc, out, err = run_in_process_split(["--num-ps", "2"] + dry, env=env)
            self.assertEqual(rc, 0, out + err)
            self.assertEqual(out.count("CURVE is on"), int(exposed_nodes), out)
            self.assertEqual("--curve-keys" in out, exposed_nodes, out)
            self.assertNotIn("warning", err)
            rc, out, err = run_in_process_split(["--num-ps", "2", "--no-curve"] + dry, env=env)
            self.assertEqual(rc, 0, out + err)
            self.assertEqual(err.count("warning: --no-curve: servers listen without CURVE"), int(exposed_nodes),
                             err)
        for flags, other in ((["--no-curve", "--curve"], "--curve"),
                             (["--no-curve", "--curve-keys", self.dir], "--curve-keys DIR")):
            rc, out, err = run_in_process_split(["--num-ps", "1"] + flags + dry)
            self.assertEqual(rc, 2, out + err)
            self.assertIn(f"--no-curve and {other} are exclusive", err)
        # A real start (preflight and the run stubbed out): the warning is said once, before
        # anything starts.
        fl = load_launcher_module()
        calls = []

        def fake_run(launcher):
            calls.append("run")
            print("FAKE RUN")
            return 0

        with unittest.mock.patch.object(fl.cli, "preflight", lambda *a: calls.append("preflight")), \
                unittest.mock.patch.object(fl.cli.Launcher, "run", fake_run):
            rc, out, err = run_in_process_split(["--num-ps", "1", "--num-workers", "1", "--host",
                                                 "node5", "--gpus-per-host", "0", "--no-curve"], merged=True)
            self.assertEqual((rc, calls), (0, ["preflight", "run"]), out)
            self.assertEqual(out.count("warning"), 1, out)
            self.assertLess(out.index("warning: --no-curve: servers listen without CURVE"),
                            out.index("FAKE RUN"))
            rc, out, _ = run_in_process_split(["--num-ps", "1", "--num-workers", "1", "--host",
                                               "node5", "--gpus-per-host", "0", "--curve-keys",
                                               os.path.join(self.dir, "keys")], merged=True)
            self.assertEqual(rc, 0, out)
            self.assertNotIn("warning", out)

    def test_curve_makes_the_keys_and_every_process_gets_them(self):
        # No --log-dir: the keys go to the temp log dir, known only after preflight. Worker 1
        # fails once and is restarted with --resume: with the keys too.
        bin_dir = self.stub_bins()
        rc, out = run_launcher(["--num-ps", "2", "--num-workers", "2", "--base-port", "0",
                                "--gpus-per-host", "0", "--grace", "1", "--bin-dir", bin_dir,
                                "--curve", "--", "--stub-fail-once-rank", "1"],
                               timeout=30, env={"FERRY_STUB_KEYS_LOG": os.path.join(
                                   self.dir, "ferry-keys-calls")})
        logs = re.search(r"^ferry-launch: logs in (\S+)$", out, re.M)
        if logs:
            self.addCleanup(shutil.rmtree, logs.group(1), True)
        self.assertEqual(rc, 0, out)
        keys = os.path.join(logs.group(1), "keys")
        self.assertEqual(self.keys_log(), [[keys, "--workers", "2"]])
        self.assertEqual(sorted(os.listdir(keys)), sorted(KEY_FILES_2))
        self.assertIn(f"ferry-launch: --curve: the job's keys are in {keys} (owner-only; "
                      f"--curve-keys {keys} uses them again)", out)
        cmds = started_commands(out)
        self.assertEqual(sorted(cmds), ["ps 0", "ps 1", "worker 0", "worker 1"], out)
        self.assertEqual(len(cmds["worker 1"]), 2, out)  # started, restarted
        self.assertIn(" --resume ", cmds["worker 1"][1])
        for who, lines in cmds.items():
            for line in lines:
                self.assertEqual(key_folders(shlex.split(line)), [keys], line)
        self.assertNotIn("warning", out)
        self.assert_stubs_gone(out)

    def test_curve_readers_makes_read_only_keys_beside_the_jobs(self):
        bin_dir = self.stub_bins()
        rc, out = run_launcher(["--num-ps", "1", "--num-workers", "2", "--base-port", "0",
                                "--gpus-per-host", "0", "--grace", "1", "--bin-dir", bin_dir,
                                "--log-dir", os.path.join(self.dir, "logs"), "--curve", "--readers", "2"],
                               timeout=30, env={"FERRY_STUB_KEYS_LOG": os.path.join(
                                   self.dir, "ferry-keys-calls")})
        self.assertEqual(rc, 0, out)
        keys = os.path.join(self.dir, "logs", "keys")
        self.assertEqual(self.keys_log(), [[keys, "--workers", "2", "--readers", "2"]])
        self.assertEqual(sorted(os.listdir(keys)),
                         sorted(KEY_FILES_2 + ["readers.pub", "reader-0.key", "reader-1.key"]))
        self.assert_stubs_gone(out)
        for bad, why in ((["--no-curve"], "not with --no-curve"), (["--readers", "-1"], "in [0, 65536]")):
            rc, out = run_launcher(["--num-ps", "1", "--num-workers", "1", "--bin-dir", bin_dir, "--readers", "1"]
                                   + bad, timeout=30)
            self.assertEqual(rc, 2, out)
            self.assertIn(why, out)

    def test_curve_replaces_an_earlier_runs_keys(self):
        bin_dir = self.stub_bins()
        logs = os.path.join(self.dir, "logs")
        args = ["--num-ps", "1", "--num-workers", "2", "--base-port", "0", "--gpus-per-host",
                "0", "--bin-dir", bin_dir, "--log-dir", logs, "--curve"]
        env = {"FERRY_STUB_KEYS_LOG": os.path.join(self.dir, "ferry-keys-calls")}
        keys = os.path.join(logs, "keys")
        for run in range(2):
            rc, out = run_launcher(args, timeout=30, env=env)
            self.assertEqual(rc, 0, out)
            self.assertEqual(f"--curve: removed the keys an earlier run left in {keys}" in out,
                             run == 1, out)
            for who, lines in started_commands(out).items():
                self.assertEqual(key_folders(shlex.split(lines[0])), [keys], lines[0])
            self.assert_stubs_gone(out)
        self.assertEqual(self.keys_log(), [[keys, "--workers", "2"]] * 2)

    def test_curve_key_tool_problems_stop_before_anything_starts(self):
        logs = os.path.join(self.dir, "logs")
        args = ["--num-ps", "1", "--num-workers", "2", "--base-port", "0", "--gpus-per-host",
                "0", "--log-dir", logs, "--curve"]
        bin_dir = self.stub_bins(keys=False)
        rc, out = run_in_process(args + ["--bin-dir", bin_dir])
        self.assertEqual(rc, 2, out)
        self.assertIn(f"preflight: binary not found: {bin_dir}/ferry-keys (build first, or pass "
                      "--bin-dir) (--curve runs it to make the job's keys; or make them yourself "
                      "and pass --curve-keys DIR)", out)
        bin_dir = self.stub_bins()
        rc, out = run_in_process(args + ["--bin-dir", bin_dir], env={"FERRY_STUB_KEYS_FAIL": "1"})
        self.assertEqual(rc, 2, out)
        self.assertIn(f"ferry-launch: error: --curve: `{bin_dir}/ferry-keys {logs}/keys "
                      "--workers 2` failed (exit status 1): ferry-keys: failing on purpose", out)
        self.assertNotIn("started", out)

    @unittest.skipUnless(shutil.which("setsid"), "setsid (util-linux) not installed")
    def test_ssh_hosts_need_their_key_files(self):
        # Workers on "node-a" and "node-b" through an ssh that runs them here: the check there
        # finds the files or names the missing ones.
        bin_dir = self.stub_bins()
        ssh = write_script(os.path.join(self.dir, "fake-ssh"), LOCAL_SSH)
        spec = os.path.join(self.dir, "spec.json")
        with open(spec, "w") as f:
            json.dump({"ps": [f"127.0.0.1:{free_ports(1)[0]}"], "worker": ["node-a", "node-b"]},
                      f)
        keys = make_key_folder(os.path.join(self.dir, "keys"),
                               [n for n in KEY_FILES_2 if n != "worker-1.key"])
        args = ["--spec", spec, "--bin-dir", bin_dir, "--ssh", ssh, "--gpus-per-host", "0",
                "--log-dir", os.path.join(self.dir, "logs")]
        rc, out = run_launcher(args + ["--curve-keys", keys], timeout=30)
        self.assertEqual(rc, 2, out)
        self.assertIn(f"preflight: on host 'node-b' (worker[1]): CURVE key files missing or "
                      f"unreadable: {keys}/worker-1.key (copy them there, to the same path: a "
                      "server needs server.key and workers.pub, worker R server.pub and "
                      "worker-R.key; see launch/README.md)", out)
        self.assertNotIn("node-a", out)
        self.assertNotIn("started", out)
        os.close(os.open(os.path.join(keys, "worker-1.key"), os.O_WRONLY | os.O_CREAT, 0o600))
        rc, out = run_launcher(args + ["--curve-keys", keys], timeout=30)
        self.assertEqual(rc, 0, out)
        cmds = started_commands(out)
        self.assertEqual(sorted(cmds), ["ps 0", "worker 0", "worker 1"], out)
        for who, lines in cmds.items():
            self.assertEqual(key_folders(shlex.split(lines[0])), [keys], lines[0])
        # --curve: the keys are made in the log dir here, then looked for there (found: "node-a"
        # is this machine).
        rc, out = run_launcher(args + ["--curve"], timeout=30)
        self.assertEqual(rc, 0, out)
        made = os.path.join(self.dir, "logs", "keys")
        for who, lines in started_commands(out).items():
            self.assertEqual(key_folders(shlex.split(lines[0])), [made], lines[0])
        self.assert_stubs_gone(out)

    def test_slurm_step_gets_the_keys(self):
        bin_dir = self.stub_bins()
        logs = os.path.join(self.dir, "logs")
        srun = write_script(os.path.join(self.dir, "fake-srun"), FAKE_SRUN)
        env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "127.0.0.[1-2]",
               "FAKE_SRUN_ARGS": os.path.join(self.dir, "srun-args.json")}
        rc, out = run_launcher(["--slurm", "--srun", srun, "--num-ps", "1", "--num-workers", "2",
                                "--base-port", "0", "--gpus-per-host", "0", "--bin-dir", bin_dir,
                                "--log-dir", logs, "--curve"], timeout=30, env=env)
        self.assertEqual(rc, 0, out)
        keys = os.path.join(logs, "keys")
        with open(env["FAKE_SRUN_ARGS"]) as f:
            self.assertEqual(key_folders(json.load(f)["cmd"]), [keys])
        cmds = started_commands(out)
        self.assertEqual(sorted(cmds), ["ps 0", "worker 0", "worker 1"], out)
        for who, lines in cmds.items():
            self.assertEqual(key_folders(shlex.split(lines[0])), [keys], lines[0])
        self.assert_stubs_gone(out)
        # A task checks, on its node, the files its process reads before it starts it.
        os.remove(os.path.join(keys, "worker-1.key"))
        r = subprocess.run(
            [sys.executable, LAUNCHER, "--slurm-task", "--spec-json", json.dumps(
                {"ps": ["127.0.0.1:7470"], "worker": ["127.0.0.1", "127.0.0.2"]}), "--bin-dir",
             bin_dir, "--gpus-per-host", "0", "--curve-keys", keys, "--"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
            env=launcher_env({"SLURM_PROCID": "2", "SLURMD_NODENAME": "127.0.0.2"}))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(f"ferry-launch: error: worker 1 on 127.0.0.2: --curve-keys {keys}: missing "
                      "key file worker-1.key (worker 1's keypair);", r.stdout)
        self.assertIn("(the key folder must be on a file system every node sees, at the same "
                      "path)", r.stdout)
        self.assertTrue(r.stdout.rstrip().endswith("[task-exit 1]"), r.stdout)
        self.assertNotIn("started", r.stdout)


@unittest.skipUnless(os.path.exists(KEYS_BIN),
                     f"binary missing: {KEYS_BIN} (ferry-keys is not built yet)")
class CurveEndToEndTest(unittest.TestCase):
    """The real binaries under --curve: a 1-server, 2-worker job trains to completion with the
    keys the launcher made, then again with those keys given (--curve-keys)."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="ferry-launch-test-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def run_job(self, name, curve):
        logs = os.path.join(self.dir, name)
        rc, out = run_launcher(["--num-ps", "1", "--num-workers", "2", "--base-port", "0",
                                "--gpus-per-host", "0", "--bin-dir", BUILD_DIR, "--log-dir",
                                logs] + curve + ["--"] + SHORT_TRAINING, timeout=60)
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"\[worker 0\] done: 20 steps")
        self.assertRegex(out, r"\[worker 1\] done: 20 steps")
        self.assertIn("done: 2 workers finished, 1 servers stopped", out)
        self.assertNotIn("warning", out)
        pids = dict(all_pids(out))
        self.assertEqual(sorted(pids), ["ps 0", "worker 0", "worker 1"], out)
        wait_until_gone(pids.values())
        self.assertEqual([w for w, p in pids.items() if pid_alive(p)], [], "processes survived")
        return logs, out

    def test_curve_job_trains_to_completion(self):
        logs, out = self.run_job("logs", ["--curve"])
        keys = os.path.join(logs, "keys")
        self.assertEqual(os.stat(keys).st_mode & 0o777, 0o700)
        self.assertEqual(sorted(os.listdir(keys)), sorted(KEY_FILES_2))
        for name in KEY_FILES_2:
            self.assertEqual(os.stat(os.path.join(keys, name)).st_mode & 0o777, 0o600, name)
        for who, lines in started_commands(out).items():
            self.assertEqual(key_folders(shlex.split(lines[0])), [keys], lines[0])
        # The same keys again, given.
        _, out = self.run_job("again", ["--curve-keys", keys])
        for who, lines in started_commands(out).items():
            self.assertEqual(key_folders(shlex.split(lines[0])), [keys], lines[0])


if __name__ == "__main__":
    unittest.main()
