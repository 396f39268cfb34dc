"""The `ferry` Python module against real ferry-ps processes on 127.0.0.1: two workers (threads,
one Client each) train a small model with numpy in sync mode; arrays are used in place; errors
raise ferry.Error with the server's text; TF_CONFIG is read; ids must be integers; a `with`
block's normal exit finishes the worker; the server's log line when it takes the worker count
from the first worker; slots moved between the running servers (move_slots), another worker's
client following the new map.

Needs FERRY_BUILD_DIR (ctest sets it) and Debian's python3 with python3-numpy (the module is
built for it: build/python). Run by hand, from tests/e2e/:
  FERRY_BUILD_DIR=../../build /usr/bin/python3 -m unittest -v test_python_module
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import unittest

from build_paths import BUILD_DIR
from test_sync_cluster import Servers

# ctest registers this test only where the module is built: failing to import it is a failure.
sys.path.insert(0, os.path.join(BUILD_DIR, "python"))
import numpy as np  # noqa: E402
import ferry  # noqa: E402


class LoggedServers(Servers):
    """Servers whose output after the endpoint line is read as it comes (a thread each):
    log(r) is what ferry-ps r has written so far; wait_for_log waits for a line, with a deadline."""

    def __init__(self, n, **kw):
        super().__init__(n, **kw)
        self._lines = [[] for _ in self.procs]
        self._cv = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(r,), daemon=True) for r in range(n)]
        for t in self._readers:
            t.start()

    def _read(self, r):
        for line in self.procs[r].stdout:
            with self._cv:
                self._lines[r].append(line)
                self._cv.notify_all()

    def log(self, r):
        with self._cv:
            return "".join(self._lines[r])

    def wait_for_log(self, r, pattern, timeout=60):
        with self._cv:
            found = self._cv.wait_for(lambda: re.search(pattern, "".join(self._lines[r]), re.M), timeout)
        if not found:
            raise AssertionError(f"ferry-ps {r} did not log /{pattern}/ within {timeout} s; it logged:\n{self.log(r)}")

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
        for t in self._readers:  # at EOF: every process has exited
            t.join(timeout=10)
        super().stop()


# How ferry-ps logs a worker whose connection closed before it finished (ps/server/src/peers.cc).
VANISHED = r"worker {rank}'s connection from \S+ closed after .* before the worker finished"


class PythonModuleTest(unittest.TestCase):
    def test_two_workers_train_a_model_with_dense_and_sparse_tables(self):
        # y = x . w_true + bias_true[id]: a dense weight vector and a per-id bias (a sparse table
        # of dim 1), fitted by two sync workers with plain SGD on the squared error.
        rng = np.random.default_rng(7)
        w_true = rng.normal(size=8).astype(np.float32)
        bias_true = rng.normal(size=50).astype(np.float32)
        steps, batch = 150, 32
        losses = {0: [], 1: []}
        finals = {}
        errors = []

        def worker(rank, endpoints):
            try:
                data = np.random.default_rng(100 + rank)
                with ferry.Client(endpoints, rank=rank, num_workers=2, request_timeout=60) as c:
                    c.declare_dense("w", (8,), optimizer="sgd", lr=0.1, consistency="sync")
                    c.declare_sparse("bias", 1, optimizer="sgd", lr=0.5, consistency="sync")
                    w = np.empty(8, np.float32)
                    for step in range(steps):
                        x = data.normal(size=(batch, 8)).astype(np.float32)
                        ids = data.integers(0, 50, size=batch)
                        y = x @ w_true + bias_true[ids]
                        self.assertIs(c.pull_dense("w", w, step=step).wait(), w)  # written in place
                        b = c.pull_sparse("bias", ids, step=step).wait()
                        self.assertEqual(b.shape, (batch, 1))
                        err = x @ w + b[:, 0] - y
                        losses[rank].append(float(np.mean(err ** 2)))
                        gw = (x.T @ err / batch).astype(np.float32)
                        uniq, inv = np.unique(ids, return_inverse=True)
                        gb = np.zeros((len(uniq), 1), np.float32)
                        np.add.at(gb[:, 0], inv, err / batch)
                        h1 = c.push_dense("w", gw, step=step)
                        h2 = c.push_sparse("bias", uniq, gb, step=step)
                        h1.wait()
                        h2.wait()
                        self.assertTrue(h1.done())
                    c.pull_dense("w", w, step=steps).wait()
                    finals[rank] = w.copy()
                    c.finish()
            except Exception as e:  # noqa: BLE001 — reported by the main thread
                errors.append(f"worker {rank}: {type(e).__name__}: {e}")

        with Servers(2) as s:
            threads = [threading.Thread(target=worker, args=(r, s.endpoints)) for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            self.assertFalse(any(t.is_alive() for t in threads), "a worker did not finish within 120 s")
        self.assertEqual(errors, [])
        for r in range(2):
            first, last = np.mean(losses[r][:10]), np.mean(losses[r][-10:])
            self.assertLess(last, 0.05 * first, f"worker {r}: loss {first:.3f} -> {last:.3f}")
        # Sync: both workers read the same parameters, bit for bit; and they fit the true weights.
        self.assertTrue(np.array_equal(finals[0], finals[1]))
        self.assertLess(float(np.max(np.abs(finals[0] - w_true))), 0.1, (finals[0], w_true))

    def test_ftrl_rows_follow_the_closed_form(self):
        # FTRL-Proximal on the server (alpha = lr = 1, beta = 1, l1 = 1, l2 = 0.5, n from 0), rows
        # from zeros: a gradient of 3 gives n = 9, z = 3 and w = -(3 - 1) / ((1 + 3) / 1 + 0.5)
        # = -4/9; one of 0.5 leaves |z| <= l1, so w stays 0 (the L1 sparsity FTRL is used for).
        with Servers(1) as s:
            with ferry.Client(s.endpoints) as c:
                c.declare_sparse("ctr", 1, optimizer="ftrl", lr=1.0,
                                 options={"l1": 1.0, "l2": 0.5, "beta": 1.0, "initial_accumulator": 0.0})
                ids = np.array([11, 12], np.int64)
                c.push_sparse("ctr", ids, np.array([[3.0], [0.5]], np.float32)).wait()
                rows = c.pull_sparse("ctr", ids).wait()
                self.assertAlmostEqual(float(rows[0, 0]), -4.0 / 9.0, places=6)
                self.assertEqual(float(rows[1, 0]), 0.0)
                with self.assertRaises(ferry.Error) as e:
                    c.declare_sparse("bad", 1, optimizer="ftrl", options={"l1": -1.0})
                self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
                self.assertIn("l1", str(e.exception))
                with self.assertRaises(ferry.Error) as e:
                    c.declare_sparse("bad", 1, options={"bogus": 1.0})
                self.assertIn("unknown key 'bogus'", str(e.exception))

    def test_compressed_tables_travel_in_16_bits_and_top_k(self):
        # Gradient compression (protocol 1.6): a bf16 dense table's pull is the server's float32
        # rounded to bf16; a top-k table (2 of 4 a push) sends the largest and keeps the rest.
        with Servers(1) as s:
            with ferry.Client(s.endpoints) as c:
                c.declare_dense("b", (3,), lr=1.0, wire="bf16")
                c.push_dense("b", np.array([1.0, 1.0 + 2.0 ** -7, 3.0], np.float32)).wait()
                c.push_dense("b", np.array([2.0 ** -9, 0.0, 0.0], np.float32)).wait()
                out = np.empty(3, np.float32)
                c.pull_dense("b", out).wait()
                # The server holds -(1 + 2^-9), which bf16 rounds to -1 (8 significant bits).
                self.assertEqual(out.tolist(), [-1.0, -(1.0 + 2.0 ** -7), -3.0])
                c.declare_dense("k", (4,), lr=1.0, options={"topk": 0.5})
                c.push_dense("k", np.array([1.0, -3.0, 0.5, 2.0], np.float32)).wait()
                k = np.empty(4, np.float32)
                c.pull_dense("k", k).wait()
                self.assertEqual(k.tolist(), [0.0, 3.0, 0.0, -2.0])
                c.push_dense("k", np.zeros(4, np.float32)).wait()
                c.pull_dense("k", k).wait()
                self.assertEqual(k.tolist(), [-1.0, 3.0, -0.5, -2.0])
                c.declare_sparse("e", 2, lr=1.0, wire="fp16")
                c.push_sparse("e", np.array([5], np.int64), np.array([[0.1, 70000.0]], np.float32)).wait()
                row = c.pull_sparse("e", np.array([5], np.int64)).wait()
                self.assertEqual(row.tolist(), [[-0.0999755859375, -65504.0]])  # fp16 rounds and saturates
                with self.assertRaises(ferry.Error) as e:
                    c.declare_dense("bad", (2,), wire="fp8")
                self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
                self.assertIn("'fp8' is not one of: f32, fp16, bf16", str(e.exception))
                with self.assertRaises(ferry.Error) as e:
                    c.declare_sparse("bad", 2, options={"topk": 0.5})
                self.assertIn("table 'bad': topk is for dense tables", str(e.exception))

    def test_a_long_wait_is_said_on_stderr(self):
        # Nothing listens at the address: the handshake's wait is reported while it lasts, then
        # the connection fails. C's stderr, so a child process.
        with tempfile.TemporaryDirectory() as tmp:
            code = ("import ferry\n"
                    f"try: ferry.Client(['ipc://{tmp}/none'], connect_timeout=2.0, long_wait_every=0.5)\n"
                    "except ferry.Error as e: print('refused:', e.code)\n")
            env = dict(os.environ, PYTHONPATH=os.path.join(BUILD_DIR, "python"))
            p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, timeout=60, env=env)
            self.assertIn("refused: DEADLINE_EXCEEDED", p.stdout, p.stderr)
            self.assertRegex(p.stderr, rf"ferry: worker 0 waiting \d s \(of 2\) for server 0 \(ipc://{tmp}/none\) "
                                       r"to answer Hello \(is it running")
            quiet = code.replace("long_wait_every=0.5", "long_wait_every=0")
            p = subprocess.run([sys.executable, "-c", quiet], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, timeout=60, env=env)
            self.assertIn("refused: DEADLINE_EXCEEDED", p.stdout, p.stderr)
            self.assertNotIn("waiting", p.stderr)

    def test_a_later_incarnation_takes_the_rank_over(self):
        # A later start of worker 0 (ferry-launch numbers them) takes the rank over at once from
        # a client that is alive; that one is refused from then on, and the rank's steps carry
        # over to its successor (where a restarted async worker resumes).
        with Servers(1) as s:
            c = ferry.Client(s.endpoints)
            try:
                c.declare_dense("v", (2,))
                self.assertEqual(c.worker_step, 0)
                c.push_dense("v", np.ones(2, np.float32), step=6).wait()
                with ferry.Client(s.endpoints, connect_timeout=1, incarnation=1) as successor:
                    self.assertEqual(successor.worker_step, 7)
                    with self.assertRaises(ferry.Error) as e:
                        c.push_dense("v", np.ones(2, np.float32), step=7).wait()
                    self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
                    self.assertIn("worker 0's process of incarnation 0 was replaced by its incarnation 1",
                                  str(e.exception))
            finally:
                c.close()  # not finish(): the replaced process may no longer speak for worker 0

    def test_errors_carry_the_servers_text_and_code(self):
        with Servers(1) as s:
            with ferry.Client(s.endpoints) as c:
                c.declare_sparse("emb", 8)
                with self.assertRaises(ferry.Error) as e:
                    c.declare_sparse("emb", 4)  # the server refuses the conflicting spec
                self.assertEqual(e.exception.code, "ALREADY_EXISTS")
                self.assertIn("table 'emb' cannot change its dim 8 -> 4", str(e.exception))
                # A second client for worker 0 while this one is alive is refused.
                with self.assertRaises(ferry.Error) as e:
                    ferry.Client(s.endpoints, connect_timeout=1)
                self.assertEqual(e.exception.code, "ALREADY_EXISTS")
                self.assertIn("worker 0 is connected already", str(e.exception))
                with self.assertRaises(ferry.Error) as e:
                    c.pull_dense("nope", np.empty(3, np.float32)).wait()
                self.assertEqual(e.exception.code, "NOT_FOUND")
                with self.assertRaises(ferry.Error) as e:
                    c.declare_dense("w", (4,), optimizer="lbfgs")
                self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
                self.assertIn("lbfgs", str(e.exception))
                c.declare_dense("w", (4,))
                with self.assertRaises(TypeError):
                    c.pull_dense("w", np.empty(4, np.float64))  # cannot be written in place
                with self.assertRaises(TypeError):
                    c.pull_dense("w", np.empty(8, np.float32)[::2])  # not contiguous
                # Inputs of another type are converted (one copy), not refused.
                c.push_dense("w", np.ones(4, np.float64)).wait()
                saved = os.environ.pop("TF_CONFIG", None)
                try:
                    self.assertIsNone(ferry.cluster_from_tf_config())  # unset: no cluster
                finally:
                    if saved is not None:
                        os.environ["TF_CONFIG"] = saved
                self.assertEqual(c.all_reduce_sum(np.array([1.5, 2.0])).tolist(), [1.5, 2.0])
        with self.assertRaises(ferry.Error) as e:
            ferry.Client(["tcp://127.0.0.1:1"], connect_timeout=0.3)  # nothing listens there
        self.assertIn(e.exception.code, ("DEADLINE_EXCEEDED", "UNAVAILABLE"))

    def test_a_nan_gradient_is_refused_or_its_row_skipped(self):
        with Servers(1) as s:
            c = ferry.Client(s.endpoints, rank=0, num_workers=1)
            c.declare_sparse("strict", 2, lr=1.0)
            c.declare_sparse("lenient", 2, lr=1.0, skip_nonfinite_rows=True)
            ids = np.array([1, 2], np.int64)
            g = np.array([[1, 1], [np.nan, 1]], np.float32)
            with self.assertRaises(ferry.Error) as e:
                c.push_sparse("strict", ids, g).wait()
            self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
            self.assertIn("holds NaN or Inf (id 2)", str(e.exception))
            c.push_sparse("lenient", ids, g).wait()
            np.testing.assert_array_equal(c.pull_sparse("lenient", ids).wait(), [[-1, -1], [0, 0]])
            np.testing.assert_array_equal(c.pull_sparse("strict", ids).wait(), [[0, 0], [0, 0]])
            c.close()

    def test_an_update_that_would_not_be_finite_is_refused_and_the_table_takes_no_more(self):
        # Issue 35: a finite gradient whose update overflows (FTRL's n += g^2 with g = 3e38) made
        # NaN weights without a word. Now a real ferry-ps keeps that element, refuses the push
        # naming the table and element, and then every push to the table and every checkpoint.
        with tempfile.TemporaryDirectory(prefix="ferry-py-overflow-") as d:
            with Servers(1, extra_args=["--checkpoint-dir", d, "--num-workers", "1"]) as s:
                c = ferry.Client(s.endpoints, rank=0, num_workers=1)
                c.declare_sparse("f", 2, optimizer="ftrl", lr=0.1)
                ids = np.array([1, 2], np.int64)
                before = c.pull_sparse("f", ids).wait()
                g = np.array([[1, 1], [1, 3e38]], np.float32)
                with self.assertRaises(ferry.Error) as e:
                    c.push_sparse("f", ids, g).wait()
                self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
                self.assertIn("table 'f' diverged: worker 0's push: the update of id 2 element 1 would not be "
                              "finite (ftrl, lr 0.1; it is 0, its gradient 3.00000001e+38)", str(e.exception))
                after = c.pull_sparse("f", ids).wait()
                self.assertTrue(np.isfinite(after).all(), after)
                self.assertEqual(after[1, 1], before[1, 1])
                with self.assertRaises(ferry.Error) as e:
                    c.push_sparse("f", ids, np.ones((2, 2), np.float32)).wait()
                self.assertIn("refuses every push to it and every checkpoint", str(e.exception))
                with self.assertRaises(ferry.Error) as e:
                    c.checkpoint(0)
                self.assertIn("table 'f' diverged", str(e.exception))
                self.assertFalse(os.path.exists(os.path.join(d, "CURRENT")))
                c.close()

    def test_a_checkpoint_and_servers_restored_from_it(self):
        with tempfile.TemporaryDirectory(prefix="ferry-py-ckpt-") as d:
            folder = ["--checkpoint-dir", d, "--num-workers", "1"]
            with Servers(2, extra_args=folder) as s:
                c = ferry.Client(s.endpoints, rank=0, num_workers=1)
                self.assertEqual(c.restored_step, 0)
                c.declare_dense("w", (6,), optimizer="sgd", lr=1.0, consistency="sync")
                c.push_dense("w", np.arange(6, dtype=np.float32), step=0).wait()
                with self.assertRaises(ferry.Error) as e:
                    c.checkpoint(0)  # the table is at step 1 already
                self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
                self.assertIn("is at step 1, not 0", str(e.exception))
                c.checkpoint(1)
                c.close()
            with open(os.path.join(d, "CURRENT")) as f:
                self.assertEqual(f.read().strip(), "MANIFEST-00000000000000000001")
            with Servers(3, extra_args=folder + ["--restore"]) as s:
                c = ferry.Client(s.endpoints, rank=0, num_workers=1)
                self.assertEqual(c.restored_step, 1)
                c.declare_dense("w", (6,), optimizer="sgd", lr=1.0, consistency="sync")
                w = np.empty(6, np.float32)
                c.pull_dense("w", w, step=1).wait()
                np.testing.assert_array_equal(w, -np.arange(6, dtype=np.float32))
                c.close()

    def test_slots_move_between_the_running_servers(self):
        # Two workers' clients (async tables): worker 0 checkpoints and moves every slot of server 1
        # to server 0; worker 1, still at the first map, is answered "moved" and sends its pull
        # again by the new map, reading what was pushed before the move.
        with tempfile.TemporaryDirectory(prefix="ferry-py-move-") as d:
            with Servers(2, extra_args=["--checkpoint-dir", d, "--num-workers", "2"]) as s:
                c0 = ferry.Client(s.endpoints, rank=0, num_workers=2)
                c1 = ferry.Client(s.endpoints, rank=1, num_workers=2)
                c0.declare_dense("w", (64,), lr=1.0, options={"chunk_elems": 8})
                c0.declare_sparse("e", 4, lr=1.0)
                c1.declare_dense("w", (64,), lr=1.0, options={"chunk_elems": 8})
                c1.declare_sparse("e", 4, lr=1.0)
                ids = np.arange(40, dtype=np.int64)
                c0.push_dense("w", np.arange(64, dtype=np.float32)).wait()
                c0.push_sparse("e", ids, np.ones((40, 4), np.float32)).wait()
                first = c0.placement_owners
                self.assertEqual((c0.placement_version, first.dtype, len(first)), (1, np.uint16, ferry.PLACEMENT_SLOTS))
                self.assertEqual(set(first.tolist()), {0, 1})
                self.assertEqual(c0.servers_in_job, [0, 1])
                drained = np.zeros(ferry.PLACEMENT_SLOTS, np.uint16)
                c0.checkpoint(4)
                c0.prepare_move_slots(2, drained, 4)  # read ahead: changes nothing
                self.assertEqual(c0.placement_version, 1)
                with self.assertRaises(ValueError) as e:
                    c0.prepare_move_slots(2, drained.astype(np.int64) - 1, 4)
                self.assertIn("prepare_move_slots: owners[0] is -1", str(e.exception))
                c0.checkpoint(5)
                with self.assertRaises(ValueError) as e:
                    c0.move_slots(2, drained.astype(np.int64) - 1, 5)
                self.assertIn("owners[0] is -1", str(e.exception))
                with self.assertRaises(ferry.Error) as e:
                    c0.move_slots(2, drained[:10], 5)
                self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
                c0.move_slots(2, drained, 5)
                self.assertEqual(c0.placement_version, 2)
                np.testing.assert_array_equal(c0.placement_owners, drained)
                self.assertEqual(c0.servers_in_job, [0])  # server 1 owns no slot: it may leave the job
                with self.assertRaises(ferry.Error) as e:  # another map of a version taken already
                    c0.move_slots(2, first, 5)
                self.assertEqual(e.exception.code, "FAILED_PRECONDITION")

                self.assertEqual(c1.placement_version, 1)
                w = c1.pull_dense("w", np.empty(64, np.float32)).wait()
                np.testing.assert_array_equal(w, -np.arange(64, dtype=np.float32))
                rows = c1.pull_sparse("e", ids).wait()
                np.testing.assert_array_equal(rows, -np.ones((40, 4), np.float32))
                self.assertEqual(c1.placement_version, 2)
                self.assertGreater(c1.server_counters(1)["moved_answered"], 0)
                # Server 1 holds nothing now: a push goes to server 0 alone (all 8 chunks).
                applied = [c1.server_counters(r).get("updates_applied", 0) for r in (0, 1)]
                c1.push_dense("w", np.ones(64, np.float32)).wait()
                self.assertEqual(c1.server_counters(0)["updates_applied"], applied[0] + 8)
                self.assertEqual(c1.server_counters(1).get("updates_applied", 0), applied[1])
                c0.pull_dense("w", w).wait()
                np.testing.assert_array_equal(w, -np.arange(64, dtype=np.float32) - 1)
                # A move asked while the job runs (1.24): server 0 keeps it and hands it to both
                # workers at one barrier that takes moves; a second ask while it is kept is refused.
                with self.assertRaises(ValueError):
                    ferry.ask_move(s.endpoints[0], join=1, drain=1)
                with self.assertRaises(ferry.Error) as e:
                    ferry.ask_move(s.endpoints[0], drain=1)  # server 1 owns no slot now
                self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
                ferry.ask_move(s.endpoints[0], join=1)
                with self.assertRaises(ferry.Error) as e:
                    ferry.ask_move(s.endpoints[0], join=1)
                self.assertIn("a move is asked already", str(e.exception))
                got = [None, None]
                t = threading.Thread(target=lambda: got.__setitem__(1, c1.barrier_taking_moves()))
                t.start()
                got[0] = c0.barrier_taking_moves()
                t.join(60)
                self.assertEqual(got, [("join", 1), ("join", 1)])
                c0.close()
                c1.close()

    def test_a_worker_that_leaves_is_waited_for_by_no_step_and_no_barrier(self):
        # Three sync workers' clients; worker 2 pushes step 0 and leaves (asked of server 0, 1.26):
        # step 1 closes with the other two's gradients, and their barrier completes without it.
        with Servers(1, extra_args=["--num-workers", "3"]) as s:
            cs = [ferry.Client(s.endpoints, rank=r, num_workers=3, request_timeout=60) for r in range(3)]
            for c in cs:
                c.declare_dense("w", (4,), lr=1.0, consistency="sync")
            for r, c in enumerate(cs):
                c.push_dense("w", np.full(4, r, np.float32), step=0).wait()
            # 1.26: its leave is asked of server 0 and handed to all three at a barrier that takes
            # moves; it leaves before step 1, which a later process of worker 1 hears.
            with self.assertRaises(ValueError):
                ferry.ask_move(s.endpoints[0], join=0, leave_worker=2)
            ferry.ask_move(s.endpoints[0], leave_worker=2)
            got = [None] * 3
            ts = [threading.Thread(target=lambda r=r: got.__setitem__(r, cs[r].barrier_taking_moves()))
                  for r in (1, 2)]
            for t in ts:
                t.start()
            got[0] = cs[0].barrier_taking_moves()
            for t in ts:
                t.join(60)
            self.assertEqual(got, [("leave_worker", 2)] * 3)
            cs[2].leave(at=1)
            for r, c in enumerate(cs[:2]):
                c.push_dense("w", np.full(4, 3 + r, np.float32), step=1).wait()
            w = cs[0].pull_dense("w", np.empty(4, np.float32), step=2).wait()
            np.testing.assert_array_equal(w, np.full(4, -1.0 - 3.5, np.float32))  # -(0+1+2)/3 - (3+4)/2
            errors = []
            t = threading.Thread(target=lambda: errors.append(cs[1].barrier()))
            t.start()
            cs[0].barrier()
            t.join(timeout=60)
            self.assertEqual(errors, [None])
            for c in cs:
                c.close()
            # A later process of worker 1 hears of the leave and its step.
            later = ferry.Client(s.endpoints, rank=1, num_workers=3, request_timeout=60)
            self.assertEqual(later.workers_left, {2: 1})
            later.close()

    def test_a_worker_that_joins_later_is_waited_for_from_its_step_on(self):
        with Servers(1, extra_args=["--num-workers", "2"]) as s:
            c0 = ferry.Client(s.endpoints, rank=0, num_workers=2, request_timeout=60)
            self.addCleanup(c0.close)
            c1 = ferry.Client(s.endpoints, rank=1, num_workers=2, request_timeout=60, joins_at=1)
            self.addCleanup(c1.close)
            with self.assertRaises(ValueError):
                ferry.Client(s.endpoints, rank=1, num_workers=2, joins_at=-1)
            for c in (c0, c1):
                c.declare_dense("w", (2,), lr=1.0, consistency="sync")
            # Worker 1's push for step 0, while it is open, is refused and not counted.
            with self.assertRaises(ferry.Error) as e:
                c1.push_dense("w", np.ones(2, np.float32), step=0).wait()
            self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
            self.assertIn("joins_at", str(e.exception))
            c0.push_dense("w", np.ones(2, np.float32), step=0).wait()  # step 0: worker 0 alone
            w = c0.pull_dense("w", np.empty(2, np.float32), step=1).wait()
            np.testing.assert_array_equal(w, np.full(2, -1.0, np.float32))
            c0.push_dense("w", np.ones(2, np.float32), step=1).wait()
            c1.push_dense("w", np.full(2, 3.0, np.float32), step=1).wait()
            w = c1.pull_dense("w", np.empty(2, np.float32), step=2).wait()
            np.testing.assert_array_equal(w, np.full(2, -3.0, np.float32))  # -1 - (1 + 3) / 2

    def test_the_cluster_comes_from_tf_config(self):
        with Servers(2) as s:
            cluster = {"ps": [e.removeprefix("tcp://") for e in s.endpoints], "worker": ["w-0:1"]}
            config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
            parsed = ferry.cluster_from_tf_config(config)
            self.assertEqual(parsed["servers"], s.endpoints)
            self.assertEqual((parsed["rank"], parsed["num_workers"]), (0, 1))
            os.environ["TF_CONFIG"] = config
            try:
                with ferry.Client.from_tf_config() as c:
                    self.assertEqual((c.rank, c.num_workers, c.num_servers), (0, 1, 2))
            finally:
                del os.environ["TF_CONFIG"]
        with self.assertRaises(ferry.Error) as e:
            ferry.cluster_from_tf_config('{"cluster": {"ps": ["a"]}}')
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertIn("cluster.ps[0]: 'a' has no port", str(e.exception))

    def test_curve_keys_authenticate_a_worker(self):
        with tempfile.TemporaryDirectory() as tmp:
            keys = os.path.join(tmp, "keys")
            subprocess.run([os.path.join(BUILD_DIR, "bin", "ferry-keys"), keys, "--workers", "1"], check=True,
                           capture_output=True, timeout=30)
            with Servers(1, extra_args=["--curve-keys", keys]) as s:
                with ferry.Client(s.endpoints, rank=0, num_workers=1, curve_keys=keys) as c:
                    c.declare_dense("w", (4,), optimizer="sgd", lr=1.0)
                    c.push_dense("w", np.ones(4, np.float32)).wait()
                    w = np.empty(4, np.float32)
                    c.pull_dense("w", w).wait()
                    np.testing.assert_array_equal(w, -np.ones(4, np.float32))
                # Without the keys the handshake fails at once, naming the likely cause.
                with self.assertRaises(ferry.Error) as e:
                    ferry.Client(s.endpoints, rank=0, num_workers=1, connect_timeout=20)
                self.assertIn("CURVE", str(e.exception))
            with self.assertRaises(ferry.Error) as e:
                ferry.Client(["tcp://127.0.0.1:1"], rank=0, curve_keys=os.path.join(tmp, "nowhere"))
            self.assertEqual(e.exception.code, "NOT_FOUND")
            self.assertIn("curve_keys: cannot open " + os.path.join(tmp, "nowhere", "server.pub"), str(e.exception))

    def test_a_reader_key_keeps_a_serving_copy_through_the_change_feed(self):
        # ferry.ChangeFeed with a reader's key (ferry-keys --readers): a copy kept from polls equals
        # the servers' tables bit for bit, and ferry-follow (the C++ example) follows the same table.
        with tempfile.TemporaryDirectory() as tmp:
            keys = os.path.join(tmp, "keys")
            subprocess.run([os.path.join(BUILD_DIR, "bin", "ferry-keys"), keys, "--workers", "1", "--readers", "1"],
                           check=True, capture_output=True, timeout=30)
            with Servers(2, extra_args=["--curve-keys", keys]) as s:
                with ferry.Client(s.endpoints, rank=0, num_workers=1, curve_keys=keys) as c:
                    c.declare_sparse("emb", 4, optimizer="adagrad", lr=0.1)
                    c.declare_dense("w", (10,), optimizer="sgd", lr=1.0, options={"chunk_elems": 4})
                    feed = ferry.ChangeFeed(s.endpoints, curve_keys=keys, reader=0)
                    self.assertEqual(feed.num_servers, 2)
                    rng = np.random.default_rng(3)
                    copy, w = {}, np.zeros(10, np.float32)
                    pushed = set()
                    for rnd in range(3):
                        for step in range(5):
                            ids = np.unique(rng.integers(0, 200, size=20))
                            c.push_sparse("emb", ids, rng.normal(size=(len(ids), 4)).astype(np.float32)).wait()
                            pushed.update(int(i) for i in ids)
                        c.push_dense("w", np.full(10, rnd + 1, np.float32)).wait()
                        changes = feed.poll("emb")
                        self.assertEqual(changes["type"], "sparse")
                        self.assertEqual(changes["full_servers"], [0, 1] if rnd == 0 else [])
                        for i in changes["deleted"]:
                            copy.pop(int(i), None)
                        for i, row in zip(changes["ids"], changes["rows"]):
                            copy[int(i)] = row.copy()
                        dense = feed.poll("w")
                        self.assertEqual(dense["shape"], [10])
                        at = 0
                        for begin, end in dense["ranges"]:
                            w[begin:end] = dense["values"][at:at + end - begin]
                            at += end - begin
                    self.assertEqual(set(copy), pushed)
                    ids = np.array(sorted(copy), np.int64)
                    rows = c.pull_sparse("emb", ids).wait()
                    np.testing.assert_array_equal(rows, np.stack([copy[int(i)] for i in ids]))
                    pulled = np.empty(10, np.float32)
                    c.pull_dense("w", pulled).wait()
                    np.testing.assert_array_equal(w, pulled)
                    self.assertEqual(set(ferry.id_server(ids, 2).tolist()), {0, 1})
                    follow = subprocess.run(
                        [os.path.join(BUILD_DIR, "bin", "ferry-follow"), "--servers", ",".join(s.endpoints),
                         "--table", "emb", "--rounds", "2", "--every-ms", "10", "--curve-keys", keys, "--reader", "0"],
                        capture_output=True, text=True, timeout=60)
                    self.assertEqual(follow.returncode, 0, follow.stderr)
                    self.assertIn(f"round 2: 0 rows changed, 0 deleted, 0 server(s) sent all; the copy holds "
                                  f"{len(pushed)} rows", follow.stdout)

    def test_a_with_block_finishes_on_a_normal_exit_and_only_closes_on_an_exception(self):
        with LoggedServers(1) as s:
            # Worker 0 leaves its block normally: it finishes, so the server does not log it as
            # a worker that vanished.
            with ferry.Client(s.endpoints, rank=0, num_workers=2) as c:
                c.declare_dense("w", (2,))
            with self.assertRaises(ferry.Error):
                c.barrier()  # closed at the end of the block
            # Worker 1 leaves by an exception: it only closes, so the server logs it. That line
            # comes after anything worker 0's close could have made the server log (at most one
            # such line a second, so a line for worker 0 would hold this one back).
            with self.assertRaises(KeyError):
                with ferry.Client(s.endpoints, rank=1, num_workers=2) as c:
                    c.declare_dense("w", (2,))
                    raise KeyError("the training failed")
            s.wait_for_log(0, VANISHED.format(rank=1))
            log = s.log(0)
            self.assertNotRegex(log, VANISHED.format(rank=0))
            self.assertNotIn("held back", log)
            # A client closed inside its block is left alone at the end.
            with ferry.Client(s.endpoints, rank=0, num_workers=2) as c:
                c.close()

    def test_a_server_without_num_workers_says_it_took_the_count_from_the_first_worker(self):
        line = (r"^ferry-ps 0: the job has 3 workers, as worker 2 \(the first to connect\) says; without "
                r"--num-workers this server keeps that count for the rest of its life$")
        with LoggedServers(1) as s:
            with ferry.Client(s.endpoints, rank=2, num_workers=3):
                pass
            with ferry.Client(s.endpoints, rank=0, num_workers=3):
                pass
            with self.assertRaises(ferry.Error) as e:  # the count holds for the server's life
                ferry.Client(s.endpoints, rank=0, num_workers=2)
            self.assertIn("says the job has 2 workers, but it has 3", str(e.exception))
            s.wait_for_log(0, line)
        self.assertEqual(len(re.findall(line, s.log(0), re.M)), 1, s.log(0))
        # With --num-workers, nothing to say. (The line is written before the Hello's reply.)
        with LoggedServers(1, extra_args=["--num-workers", "3"]) as s:
            with ferry.Client(s.endpoints, rank=2, num_workers=3):
                pass
        self.assertNotIn("the job has", s.log(0))

    def test_ids_must_be_integers(self):
        with Servers(1) as s:
            with ferry.Client(s.endpoints) as c:
                c.declare_sparse("emb", 2, lr=1.0)
                ones = np.ones((2, 2), np.float32)
                # Every integer dtype, any width and sign, names the same rows.
                for i, dtype in enumerate([np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                                           np.uint64]):
                    c.push_sparse("emb", np.array([3, 100], dtype), ones).wait()
                    rows = c.pull_sparse("emb", np.array([100, 3], dtype)).wait()
                    np.testing.assert_array_equal(rows, np.full((2, 2), -(i + 1.0)), err_msg=str(dtype))
                # Lists, non-contiguous arrays, negative ids, the int64 extremes and [] work too.
                np.testing.assert_array_equal(c.pull_sparse("emb", [3]).wait(), [[-8, -8]])
                np.testing.assert_array_equal(c.pull_sparse("emb", np.array([3, 0, 100], np.int32)[::2]).wait(),
                                              [[-8, -8], [-8, -8]])
                extremes = np.array([-1, np.iinfo(np.int64).min, np.iinfo(np.int64).max], np.int64)
                c.push_sparse("emb", extremes, np.ones((3, 2), np.float32)).wait()
                np.testing.assert_array_equal(c.pull_sparse("emb", extremes).wait(), np.full((3, 2), -1.0))
                self.assertEqual(c.pull_sparse("emb", []).wait().shape, (0, 2))
                # A uint64 id within int64 is that id; one above has no int64 id.
                np.testing.assert_array_equal(
                    c.pull_sparse("emb", np.array([np.iinfo(np.int64).max], np.uint64)).wait(), [[-1, -1]])
                with self.assertRaises(OverflowError) as e:
                    c.pull_sparse("emb", np.array([2 ** 63], np.uint64))
                self.assertIn("pull_sparse: ids: 9223372036854775808 is above the largest int64 id", str(e.exception))

                # Floats are refused, not truncated: 1.7 would become 1, and a float64 above 2^53
                # has lost digits already. So are bools and objects. Each call names its argument.
                for bad, dtype in [(np.array([1.7]), "float64"), (np.array([2.0 ** 53 + 2]), "float64"),
                                   (np.array([1.0], np.float32), "float32"), (np.array([True]), "bool"),
                                   (np.array([1, "a"], object), "object")]:
                    calls = {
                        "pull_sparse: ids": lambda: c.pull_sparse("emb", bad),
                        "push_sparse: ids": lambda: c.push_sparse("emb", bad, np.ones((len(bad), 2), np.float32)),
                        "pull_sparse_tables: entry 1: ids":
                            lambda: c.pull_sparse_tables([("emb", [1], None), ("emb", bad, None)]),
                        "push_sparse_tables: entry 0: ids":
                            lambda: c.push_sparse_tables([("emb", bad, np.ones((len(bad), 2), np.float32))]),
                        "dedup: entry 1": lambda: ferry._ferry.dedup([np.array([1]), bad]),
                    }
                    for what, call in calls.items():
                        with self.assertRaises(TypeError, msg=f"{what} {dtype}") as e:
                            call()
                        self.assertIn(f"{what} must be an array of integers (any width and sign), not {dtype}",
                                      str(e.exception))
                with self.assertRaises(TypeError) as e:
                    c.pull_sparse("emb", np.array([], np.float64))  # an empty float array is still floats
                self.assertIn("not float64", str(e.exception))
                # Nothing was pushed by the refused calls.
                np.testing.assert_array_equal(c.pull_sparse("emb", [1, 3]).wait(), [[0, 0], [-8, -8]])


if __name__ == "__main__":
    unittest.main()
