"""Checkpoints on a disk that fills up, with a real ferry-ps and ferry-trainer on tcp loopback.

The checkpoint folder is a small tmpfs mounted in a mount namespace of the server's own
(unshare -m; needs root, else the tests skip saying so), so nothing outside the test sees it and
it goes away with the server. A shard of this job's MLP is 306,272 bytes.

- A disk that holds the kept checkpoints (--keep-checkpoints 3) but not one more: the server
  removes its shard of the oldest before writing the next, so every checkpoint is saved. Before,
  the oldest went only after the new one was saved, so the fourth and every later one failed.
- A disk too small for any: after --max-checkpoint-failures (3) in a row, worker 0 stops the job,
  exit status 2, naming the cause, instead of training on without checkpoints.

Needs FERRY_BUILD_DIR (the CMake build dir); ctest sets it. Every process is started by the test,
with a deadline, and killed at the end.
"""

import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest

from build_paths import PS_BIN, TRAINER_BIN

DEADLINE_S = 120
SHARD_BYTES = 306272  # one server's shard of the job below (MLP 784-32-10, Adam)
MLP = ["--model", "mlp", "--hidden", "32", "--optimizer", "adam", "--lr", "0.001", "--batch", "32",
       "--train-limit", "2000", "--test-limit", "500", "--consistency", "sync", "--log-every", "0",
       "--blas-threads", "1", "--device", "cpu"]


def can_mount_tmpfs():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = tempfile.mkdtemp(prefix="ferry-tmpfs-probe-")
    try:
        r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {probe}"],
                           capture_output=True, timeout=30)
        return r.returncode == 0
    finally:
        os.rmdir(probe)


class Server:
    """One ferry-ps whose --checkpoint-dir is a tmpfs of `size` bytes in its own mount namespace."""

    def __init__(self, tmp, size, extra=()):
        self.folder = os.path.join(tmp, "ckpt")
        os.makedirs(self.folder)
        self.log = open(os.path.join(tmp, "ps.log"), "w+")
        cmd = [PS_BIN, "--bind", "tcp://127.0.0.1:0", "--rank", "0", "--num-servers", "1", "--num-workers", "1",
               "--checkpoint-dir", self.folder] + list(extra)
        # exec: the server is the namespace's process, and the tmpfs goes with it.
        self.proc = subprocess.Popen(["unshare", "-m", "sh", "-c",
                                      f'mount -t tmpfs -o size={size} tmpfs "$0" && exec "$@"', self.folder] + cmd,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 30
        self.endpoint = None
        while time.monotonic() < end and self.endpoint is None:
            m = re.search(r"listening on (tcp://\S+)", self.output())
            if m:
                self.endpoint = m.group(1)
            elif self.proc.poll() is not None:
                break
            time.sleep(0.02)
        if self.endpoint is None:
            self.stop()
            raise RuntimeError("ferry-ps did not start:\n" + self.output())

    def output(self):
        self.log.seek(0)
        return self.log.read()

    def files(self):
        """The checkpoint folder's files as the server sees them (its mount namespace)."""
        return sorted(os.listdir(f"/proc/{self.proc.pid}/root{self.folder}"))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=DEADLINE_S)
        self.log.close()


def train(tmp, endpoint, args):
    out = open(os.path.join(tmp, "w0.log"), "w+")
    p = subprocess.Popen([TRAINER_BIN, "--servers", endpoint, "--rank", "0", "--num-workers", "1"] + MLP + args,
                         stdout=out, stderr=subprocess.STDOUT)
    try:
        rc = p.wait(timeout=DEADLINE_S)
    finally:
        if p.poll() is None:
            p.kill()
    out.seek(0)
    text = out.read()
    out.close()
    return rc, text


@unittest.skipUnless(os.path.exists(PS_BIN) and os.path.exists(TRAINER_BIN), "ferry-ps / ferry-trainer not built")
class CheckpointDiskTest(unittest.TestCase):
    def setUp(self):
        if not can_mount_tmpfs():
            self.skipTest("needs root and unshare to mount a small tmpfs in a mount namespace of its own")
        self.tmp = tempfile.mkdtemp(prefix="ferry-ckpt-disk-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_a_disk_that_holds_the_kept_checkpoints_keeps_taking_new_ones(self):
        # Room for 3 shards (and the small files), not 4.
        server = Server(self.tmp, 3 * SHARD_BYTES + 200 * 1024, ["--keep-checkpoints", "3"])
        try:
            rc, text = train(self.tmp, server.endpoint, ["--steps", "200", "--checkpoint-every", "20"])
            files = server.files()
            log = server.output()
        finally:
            server.stop()
        self.assertEqual(rc, 0, text)
        self.assertNotIn("was not saved", text)
        saved = re.findall(r"checkpoint of step (\d+) saved", text)
        self.assertEqual(saved, [str(s) for s in range(20, 201, 20)], text)
        manifests = [f for f in files if f.startswith("MANIFEST-")]
        self.assertEqual([int(m[9:]) for m in manifests], [160, 180, 200], files)
        self.assertEqual(len([f for f in files if f.endswith(".ckpt")]), 3, files)
        self.assertFalse([f for f in files if f.endswith(".tmp")], files)
        self.assertIn("removed its shard of the checkpoint of step 20 to make room (it keeps 3)", log)

    def test_a_disk_too_small_for_any_checkpoint_stops_the_job_naming_the_cause(self):
        server = Server(self.tmp, 128 * 1024)
        try:
            rc, text = train(self.tmp, server.endpoint, ["--steps", "400", "--checkpoint-every", "20"])
            files = server.files()
        finally:
            server.stop()
        self.assertEqual(rc, 2, text)
        self.assertEqual(text.count("was not saved"), 3, text)
        self.assertRegex(text, r"ABORTED: 3 checkpoints in a row failed \(steps 20, 40, 60\): the job stops "
                               r"rather than train on without one \(--max-checkpoint-failures 3; 0 trains on\)\. "
                               r"The last failure: .*No space left on device")
        self.assertFalse([f for f in files if f.endswith(".tmp")], files)  # nothing half-written left

    def test_with_no_limit_the_job_trains_on_without_checkpoints(self):
        server = Server(self.tmp, 128 * 1024)
        try:
            rc, text = train(self.tmp, server.endpoint,
                             ["--steps", "100", "--checkpoint-every", "20", "--max-checkpoint-failures", "0"])
        finally:
            server.stop()
        self.assertEqual(rc, 0, text)
        self.assertGreaterEqual(text.count("was not saved"), 5, text)


if __name__ == "__main__":
    unittest.main()
