"""Tests of launch/ferry-launch.

Needs FERRY_BUILD_DIR (the CMake build dir holding ps/ferry-ps and trainer/trainer/ferry-trainer);
ctest sets it. Run by hand:  FERRY_BUILD_DIR=build python3 -m unittest -v test_launch
(from tests/launch/). Ports are chosen free by the test (or --base-port 0), never fixed.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.normpath(os.path.join(HERE, "..", "..", "launch", "ferry-launch"))
BUILD_DIR = os.path.abspath(os.environ.get("FERRY_BUILD_DIR",
                                           os.path.join(HERE, "..", "..", "build")))
PS_BIN = os.path.join(BUILD_DIR, "ps", "ferry-ps")
TRAINER_BIN = os.path.join(BUILD_DIR, "trainer", "trainer", "ferry-trainer")

SHORT_TRAINING = ["--model", "mlp", "--hidden", "16", "--steps", "20", "--batch", "32",
                  "--train-limit", "2000", "--test-limit", "500", "--quiet"]

# A stand-in for ferry-trainer: records its pid, then the rank named by FERRY_STUB_FAIL_RANK
# exits 3; the others sleep (ignoring SIGTERM when FERRY_STUB_IGNORE_TERM=1, to force SIGKILL).
STUB_TRAINER = textwrap.dedent(f"""\
    #!{sys.executable}
    import os, signal, sys, time
    rank = sys.argv[sys.argv.index("--rank") + 1]
    print(f"stub trainer rank {{rank}} pid {{os.getpid()}} args {{sys.argv[1:]}}", flush=True)
    if rank == os.environ.get("FERRY_STUB_FAIL_RANK"):
        time.sleep(0.5)
        print("stub: failing on purpose", flush=True)
        sys.exit(3)
    if os.environ.get("FERRY_STUB_IGNORE_TERM") == "1":
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
                                     stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, **(env or {})))
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

    @property
    def output(self):
        with self.cond:
            return "\n".join(self.lines)

    def pids(self):
        return parse_pids(self.output)


def parse_pids(output):
    """{"ps 0": pid, ...} from the launcher's "started ps 0 pid N" lines."""
    return {m.group(1): int(m.group(2)) for m in
            re.finditer(r"started (\w+ \d+) pid (\d+)", output)}


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
        d = os.path.join(self.dir, "bin")
        os.makedirs(d)
        os.symlink(PS_BIN, os.path.join(d, "ferry-ps"))
        path = os.path.join(d, "ferry-trainer")
        with open(path, "w") as f:
            f.write(STUB_TRAINER)
        os.chmod(path, 0o755)
        return d

    def assert_all_gone(self, pids):
        self.assertTrue(pids)
        alive = [f"{who} pid {pid}" for who, pid in pids.items() if pid_alive(pid)]
        self.assertEqual(alive, [], "processes survived the launcher")

    def test_local_cluster_trains_and_exits_zero(self):
        logs = os.path.join(self.dir, "logs")
        rc, out = run_launcher(["--num-ps", "2", "--num-workers", "2", "--base-port", "0",
                                "--bin-dir", BUILD_DIR, "--log-dir", logs, "--"]
                               + SHORT_TRAINING)
        self.assertEqual(rc, 0, out)
        self.assertIn("[ps 1] ferry-ps rank 1 of 2 listening", out)
        self.assertRegex(out, r"\[worker 0\] done: 20 steps")
        self.assertIn("[worker 1]", out)
        self.assertEqual(sorted(os.listdir(logs)),
                         ["ps-0.log", "ps-1.log", "worker-0.log", "worker-1.log"])
        with open(os.path.join(logs, "worker-0.log")) as f:
            self.assertIn("done: 20 steps", f.read())
        self.assert_all_gone(parse_pids(out))

    def test_spec_file_tf_config_style(self):
        ports = free_ports(2)
        spec = os.path.join(self.dir, "spec.json")
        with open(spec, "w") as f:
            json.dump({"cluster": {"ps": [f"127.0.0.1:{p}" for p in ports],
                                   "worker": ["localhost"]}}, f)
        rc, out = run_launcher(["--spec", spec, "--bin-dir", BUILD_DIR,
                                "--log-dir", os.path.join(self.dir, "logs"), "--"]
                               + SHORT_TRAINING)
        self.assertEqual(rc, 0, out)
        self.assertIn(f"--servers tcp://127.0.0.1:{ports[0]},tcp://127.0.0.1:{ports[1]}", out)

    def test_failing_worker_stops_everything(self):
        bin_dir = self.stub_bin_dir()
        r = Run(["--num-ps", "2", "--num-workers", "2", "--base-port", "0", "--grace", "1",
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
        self.assertRegex(out, r"FAILED: worker \d \(pid \d+\) failed: exit status [1-9]")

    def test_sigterm_to_launcher_leaves_nothing(self):
        bin_dir = self.stub_bin_dir()
        r = Run(["--num-ps", "2", "--num-workers", "2", "--base-port", "0",
                 "--bin-dir", bin_dir, "--log-dir", os.path.join(self.dir, "logs")])
        r.wait_for(r"\[worker 1\] stub trainer rank 1")
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

    def test_dry_run_prints_commands(self):
        rc, out = run_launcher(["--num-ps", "2", "--num-workers", "2", "--base-port", "7470",
                                "--bin-dir", BUILD_DIR, "--dry-run", "--", "--steps", "5"])
        self.assertEqual(rc, 0, out)
        lines = out.splitlines()
        self.assertEqual(len(lines), 4, out)
        self.assertEqual(lines[0], f"[ps 0] {PS_BIN} --bind tcp://127.0.0.1:7470 --rank 0 "
                                   "--num-servers 2 --compute-threads 1")
        self.assertEqual(lines[3], f"[worker 1] {TRAINER_BIN} --servers "
                                   "tcp://127.0.0.1:7470,tcp://127.0.0.1:7471 --rank 1 "
                                   "--num-workers 2 --steps 5")


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
        rc, out = run_launcher(["--spec", path, "--bin-dir", BUILD_DIR, "--dry-run"])
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
            ({"ps": ["127.0.0.1:7000"], "worker": ["node7"]},
             "worker[0] host 'node7': ssh backend not implemented yet"),
            ("{not json", "is not valid JSON"),
        ]
        for spec, want in cases:
            with self.subTest(want=want):
                out = self.spec_error(spec)
                self.assertIn("ferry-launch: error: spec:", out)
                self.assertIn(want, out)

    def test_launcher_owned_trainer_flag_rejected(self):
        rc, out = run_launcher(["--num-ps", "1", "--num-workers", "1", "--dry-run", "--",
                                "--rank", "3"])
        self.assertEqual(rc, 2, out)
        self.assertIn("trainer flag --rank is set by the launcher", out)

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


if __name__ == "__main__":
    unittest.main()
