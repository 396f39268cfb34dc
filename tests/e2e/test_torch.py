"""ferry.torch against real ferry-ps processes on 127.0.0.1 and real PyTorch (python3-torch):
embedding bags and server-held dense parameters give the steps of a pure-PyTorch reference
(nn.EmbeddingBag + nn.Linear with the same initial values and batches) under SGD, Adagrad and
Adam as the servers apply them; two sync workers of batch B take the steps of one process of
batch 2B; prefetching keeps sync runs exact; bad input raises naming the table and pushes
nothing; a server killed mid-step is named.

Needs FERRY_BUILD_DIR (ctest sets it) and Debian's python3 with python3-torch. Run by hand,
from tests/e2e/:  FERRY_BUILD_DIR=../../build /usr/bin/python3 -m unittest -v test_torch
"""

import contextlib
import io
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from build_paths import BUILD_DIR, HERE
from test_sync_cluster import Servers

# ctest registers this test only where the package is built: failing to import is a failure.
sys.path.insert(0, os.path.join(BUILD_DIR, "python"))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import ferry  # noqa: E402
import ferry.torch as ft  # noqa: E402

VOCAB = 40
TABLES = (("a", 4, "sum"), ("b", 3, "mean"))
DENSE_IN = 4 + 3 + 2   # pooled a, pooled b, two dense features


def make_batches(seed, steps, batch):
    """Per step: {"a": (ids, offsets, weights), "b": (ids, offsets)}, dense features, targets."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        feats = {}
        for name, _dim, _pool in TABLES:
            lengths = torch.randint(0, 4, (batch,), generator=g)
            ids = torch.randint(0, VOCAB, (int(lengths.sum()),), generator=g)
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)[:-1]])
            if name == "a":
                feats[name] = (ids, offsets, torch.rand(ids.numel(), generator=g) + 0.5)
            else:
                feats[name] = (ids, offsets)
        x = torch.randn(batch, 2, generator=g)
        y = torch.randn(batch, 1, generator=g)
        out.append((feats, x, y))
    return out


def model_out(pooled, x, linear):
    return linear(torch.cat([pooled["a"], pooled["b"], x], dim=1))


def split(feats, x, y, part, parts):
    """Bags part of `parts` of a batch (a worker's share of 2B)."""
    n = x.shape[0] // parts
    lo, hi = part * n, (part + 1) * n
    sub = {}
    for name, value in feats.items():
        ids, offsets = value[0], value[1]
        ends = torch.cat([offsets[1:], torch.tensor([ids.numel()])])
        a, b = int(offsets[lo]), int(ends[hi - 1])
        entry = (ids[a:b], offsets[lo:hi] - a)
        if len(value) == 3:
            entry += (value[2][a:b],)
        sub[name] = entry
    return sub, x[lo:hi], y[lo:hi]


class LazyReference:
    """The servers' optimizers, applied in PyTorch to the reference's parameters: sparse rows
    only where the batch touched them (with their own update count, as a server keeps per
    row), dense tensors whole (ps/server/src/optimizer.cc)."""

    def __init__(self, kind, lr, eps=1e-8, beta1=0.9, beta2=0.999, initial_accumulator=0.1, weight_decay=0.01):
        self.kind, self.lr, self.eps, self.b1, self.b2, self.acc0 = kind, lr, eps, beta1, beta2, initial_accumulator
        self.wd = weight_decay
        self.state = {}

    def apply(self, key, p, g, rows=None):
        """p, g: tensors; rows: the rows of an embedding table the batch touched (None: all)."""
        st = self.state.setdefault(key, {"a": torch.full_like(p, self.acc0), "m": torch.zeros_like(p),
                                         "v": torch.zeros_like(p), "t": torch.zeros(p.shape[0], dtype=torch.int64)})
        idx = rows if rows is not None else torch.arange(p.shape[0])
        with torch.no_grad():
            for r in idx.tolist():
                gr = g[r]
                if self.kind == "sgd":
                    p[r] -= self.lr * gr
                elif self.kind == "adagrad":
                    st["a"][r] += gr * gr
                    p[r] -= self.lr * gr / (torch.sqrt(st["a"][r]) + self.eps)
                else:  # adam; adamw decays first (decoupled weight decay)
                    if self.kind == "adamw":
                        p[r] *= np.float32(1.0) - np.float32(self.lr) * np.float32(self.wd)
                    st["t"][r] += 1
                    t = int(st["t"][r])
                    lr_t = np.float32(self.lr * math.sqrt(1.0 - self.b2 ** t) / (1.0 - self.b1 ** t))
                    st["m"][r] = self.b1 * st["m"][r] + (1 - self.b1) * gr
                    st["v"][r] = self.b2 * st["v"][r] + (1 - self.b2) * gr * gr
                    p[r] -= float(lr_t) * st["m"][r] / (torch.sqrt(st["v"][r]) + self.eps)


def dense_rows(p):
    """A dense parameter as rows, so that the reference treats a bias like a 1-row table."""
    return p if p.dim() >= 2 else p.view(1, -1)


def to_device(value, device):
    """A batch's tensors (nested in tuples and dicts) on `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return tuple(to_device(v, device) for v in value)


class Worker:
    """One ferry.torch worker: its session, embedding bags and server-held linear layer, the
    linear layer and the batches on `device` (test_torch_gpu.py: a GPU)."""

    def __init__(self, endpoints, rank, workers, optimizer, lr, prefix, consistency="sync", device="cpu", **options):
        self.session = ft.init(endpoints, rank, workers, request_timeout=60)
        cfgs = [ft.EmbeddingBagConfig(n, d, pooling=p, optimizer=optimizer, lr=lr, consistency=consistency,
                                      init="uniform", init_scale=0.5, seed=3, **options) for n, d, p in TABLES]
        self.ebc = ft.EmbeddingBagCollection(cfgs, session=self.session, prefix=prefix)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())  # as tensors name it
        self.linear = ft.ServerParameters(torch.nn.Linear(DENSE_IN, 1).to(self.device), session=self.session,
                                          prefix=prefix + "dense/", optimizer=optimizer, lr=lr,
                                          consistency=consistency, **options)

    def step(self, feats, x, y):
        if self.device.type != "cpu":
            feats, x, y = to_device((feats, x, y), self.device)
        pooled = self.ebc(feats)
        for n, v in pooled.items():
            if v.device != self.device:
                raise AssertionError(f"table {n}'s pooled output is on {v.device}, its ids on {self.device}")
        loss = torch.nn.functional.mse_loss(model_out(pooled, x, self.linear), y)
        loss.backward()
        return loss.item()

    def values(self):
        """The servers' tables now: every row of each table and the dense parameters."""
        self.ebc.flush()
        self.linear.flush()
        c = self.session.client
        step = self.ebc.step
        ids = np.arange(VOCAB, dtype=np.int64)
        rows = {n: torch.from_numpy(c.pull_sparse(self.ebc.server_name(n), ids, step=step).wait()).clone()
                for n, _, _ in TABLES}
        dense = {}
        for name, p in self.linear.module.named_parameters():
            out = np.empty(tuple(p.shape), np.float32)
            c.pull_dense(self.linear.prefix + name, out, step=self.linear.step).wait()
            dense[name] = torch.from_numpy(out)
        return rows, dense


def reference_start(worker):
    """A pure-PyTorch model with the servers' initial values: an EmbeddingBag per table and the
    linear layer."""
    rows, dense = worker.values()
    bags = {n: torch.nn.EmbeddingBag(VOCAB, d, mode=p) for n, d, p in TABLES}
    for n in bags:
        bags[n].weight.data.copy_(rows[n])
    linear = torch.nn.Linear(DENSE_IN, 1)
    for name, p in linear.named_parameters():
        p.data.copy_(dense[name])
    return bags, linear


def reference_step(bags, linear, opt, feats, x, y):
    pooled = {n: (bags[n](v[0], v[1], per_sample_weights=v[2]) if len(v) == 3 else bags[n](v[0], v[1]))
              for n, v in feats.items()}
    loss = torch.nn.functional.mse_loss(model_out(pooled, x, linear), y)
    for m in list(bags.values()) + [linear]:
        m.zero_grad()
    loss.backward()
    if isinstance(opt, torch.optim.Optimizer):
        opt.step()
        return float(loss)
    for n, b in bags.items():
        touched = torch.unique(feats[n][0])
        opt.apply(n, b.weight, b.weight.grad, touched)
    for name, p in linear.named_parameters():
        opt.apply(name, dense_rows(p.data), dense_rows(p.grad))
    return float(loss)


def run_workers(test, work, n, timeout):
    """Runs work(r) for r in 0..n-1 on threads; fails `test` if one is still running after
    `timeout` seconds or raised (naming the worker and the error)."""
    errors = []

    def run(r):
        try:
            work(r)
        except Exception as e:  # noqa: BLE001 — reported below
            errors.append(f"worker {r}: {type(e).__name__}: {e}")
    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    test.assertFalse(any(t.is_alive() for t in threads), f"a worker did not finish within {timeout} s")
    test.assertEqual(errors, [])


def stop(proc, timeout=10):
    """SIGSTOPs a process this test started and waits until the kernel shows it stopped (the
    signal is delivered asynchronously)."""
    proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise AssertionError(f"pid {proc.pid} not stopped {timeout} s after SIGSTOP")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def max_rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


class TorchTest(unittest.TestCase):
    def assert_same_model(self, got, want, rel):
        rows, dense = got
        bags, linear = want
        for n in bags:
            self.assertLessEqual(max_rel(rows[n], bags[n].weight.detach()), rel, f"table {n}")
        for name, p in linear.named_parameters():
            self.assertLessEqual(max_rel(dense[name], p.detach()), rel, f"dense {name}")
        # Not a vacuous match: training moved the parameters.
        self.assertGreater(max_rel(rows["a"], self.start_rows["a"]), 1e-3)

    def one_worker_against_reference(self, optimizer, lr, steps=50, **options):
        batches = make_batches(11, steps, 8)
        with Servers(2) as s:
            w = Worker(s.endpoints, 0, 1, optimizer, lr, f"one_{optimizer}/", **options)
            try:
                bags, linear = reference_start(w)
                self.start_rows = {n: b.weight.detach().clone() for n, b in bags.items()}
                if optimizer == "sgd":
                    opt = torch.optim.SGD(list(linear.parameters()) + [b.weight for b in bags.values()], lr=lr)
                else:
                    opt = LazyReference(optimizer, lr, **options)
                for feats, x, y in batches:
                    got = w.step(feats, x, y)
                    want = reference_step(bags, linear, opt, feats, x, y)
                    self.assertAlmostEqual(got, want, delta=1e-5 * max(1.0, abs(want)))
                self.assert_same_model(w.values(), (bags, linear), 1e-6)
            finally:
                w.session.close()

    def test_one_sync_worker_sgd_equals_pytorch(self):
        self.one_worker_against_reference("sgd", 0.05)

    def test_one_sync_worker_adagrad_equals_the_servers_formula(self):
        self.one_worker_against_reference("adagrad", 0.05)

    def test_one_sync_worker_adam_equals_the_servers_formula(self):
        self.one_worker_against_reference("adam", 0.01)

    def test_one_sync_worker_adamw_equals_the_servers_formula(self):
        # weight_decay 0.05 (not the default: it travels to the servers by key, protocol 1.7) at lr
        # 0.01 shrinks a touched row by 5e-4 a step, far beyond the 1e-6 the comparison allows: adam,
        # or adamw with the default decay, would not pass.
        self.one_worker_against_reference("adamw", 0.01, weight_decay=0.05)

    def test_two_sync_workers_take_the_steps_of_one_process_of_twice_the_batch(self):
        steps, batch = 30, 8
        batches = make_batches(21, steps, 2 * batch)
        results = {}
        with Servers(2) as s:
            workers = [Worker(s.endpoints, r, 2, "sgd", 0.05, "two/") for r in range(2)]
            try:
                bags, linear = reference_start(workers[0])
                self.start_rows = {n: b.weight.detach().clone() for n, b in bags.items()}

                def run(r):
                    for feats, x, y in batches:
                        workers[r].step(*split(feats, x, y, r, 2))
                    results[r] = workers[r].values()
                run_workers(self, run, 2, 120)
                opt = torch.optim.SGD(list(linear.parameters()) + [b.weight for b in bags.values()], lr=0.05)
                for feats, x, y in batches:
                    reference_step(bags, linear, opt, feats, x, y)
                for r in range(2):
                    self.assert_same_model(results[r], (bags, linear), 1e-5)
            finally:
                for w in workers:
                    w.session.close()

    def test_prefetching_keeps_a_sync_run_exact(self):
        steps = 20
        batches = make_batches(31, steps, 8)
        finals = []
        for ahead in (False, True):
            # The same table names on fresh servers: the same initial values.
            with Servers(1) as s:
                w = Worker(s.endpoints, 0, 1, "adagrad", 0.05, "prefetch/")
                try:
                    loop = ft.Prefetcher(batches, w.ebc, lambda b: b[0]) if ahead else batches
                    for feats, x, y in loop:
                        w.step(feats, x, y)
                    finals.append(w.values())
                    self.assertEqual(w.ebc.stats["pulls_taken_ahead"], steps if ahead else 0)
                finally:
                    w.session.close()
        for n, _, _ in TABLES:
            self.assertTrue(torch.equal(finals[0][0][n], finals[1][0][n]), f"table {n}")
        for name in finals[0][1]:
            self.assertTrue(torch.equal(finals[0][1][name], finals[1][1][name]), name)

    def test_async_prefetch_reads_ahead_and_learns(self):
        batches = make_batches(41, 40, 8)
        with Servers(1) as s:
            w = Worker(s.endpoints, 0, 1, "sgd", 0.05, "async/", consistency="async")
            try:
                losses = [w.step(*b) for b in ft.Prefetcher(batches * 3, w.ebc, lambda b: b[0])]
                self.assertEqual(w.ebc.stats["pulls_taken_ahead"], len(losses))
                self.assertLess(np.mean(losses[-10:]), np.mean(losses[:10]))
            finally:
                w.session.close()

    def test_embeddings_on_ferry_compose_with_ddp_dense_layers(self):
        # PERSIA's hybrid: each worker keeps the dense layer and averages its gradients with
        # DistributedDataParallel (gloo); the embeddings are sync tables on Ferry. Two workers of
        # batch B must take the steps of one process of batch 2B.
        steps, batch = 15, 8
        with Servers(2) as s, tempfile.TemporaryDirectory() as tmp:
            reader = ft.init(s.endpoints, 0, 2, request_timeout=60)
            try:
                ids = np.arange(VOCAB, dtype=np.int64)
                start = {}
                for n, d, p in TABLES:  # the servers' initial rows of the tables the workers declare
                    reader.client.declare_sparse("hybrid/" + n, d, optimizer="sgd", lr=0.05, consistency="sync",
                                                 init="uniform", init_scale=0.5, seed=3)
                    start[n] = torch.from_numpy(reader.client.pull_sparse("hybrid/" + n, ids, step=0).wait()).clone()
            finally:
                reader.close()
            port = free_port()
            out = os.path.join(tmp, "hybrid.pt")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(BUILD_DIR, "python"), HERE]))
            procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "torch_hybrid_worker.py"),
                                       ",".join(s.endpoints), str(r), str(port), str(steps), str(batch), out],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                     for r in range(2)]
            logs = []
            for p in procs:
                try:
                    logs.append(p.communicate(timeout=120)[0])
                except subprocess.TimeoutExpired:
                    for q in procs:
                        q.kill()
                    self.fail("a hybrid worker did not finish within 120 s")
            for r, p in enumerate(procs):
                self.assertEqual(p.returncode, 0, f"worker {r}:\n{logs[r]}")
            got = torch.load(out)
        bags = {n: torch.nn.EmbeddingBag(VOCAB, d, mode=p) for n, d, p in TABLES}
        for n in bags:
            bags[n].weight.data.copy_(start[n])
        torch.manual_seed(5)
        linear = torch.nn.Linear(DENSE_IN, 1)
        opt = torch.optim.SGD(list(linear.parameters()) + [b.weight for b in bags.values()], lr=0.05)
        for feats, x, y in make_batches(71, steps, 2 * batch):
            reference_step(bags, linear, opt, feats, x, y)
        self.start_rows = start
        self.assert_same_model((got["rows"], got["dense"]), (bags, linear), 1e-5)

    def test_bad_input_raises_naming_the_table_and_pushes_nothing(self):
        with Servers(1) as s:
            w = Worker(s.endpoints, 0, 1, "sgd", 0.05, "bad/")
            try:
                feats, x, y = make_batches(51, 1, 4)[0]
                before = w.session.client.server_counters(0)
                ids, offsets = feats["b"]
                cases = [
                    ({"a": feats["a"], "b": (ids.float(), offsets)}, TypeError, "table 'b': ids must be int64"),
                    ({"a": feats["a"], "b": (ids, offsets.flip(0))}, ValueError, "table 'b': offsets must"),
                    ({"a": feats["a"], "b": (ids, offsets + 100)}, ValueError, "table 'b': offsets must start at 0"),
                    ({"a": feats["a"], "b": (ids, torch.tensor([0, ids.numel() + 1]))}, ValueError,
                     "table 'b': offsets run past the end"),
                    ({"a": feats["a"], "b": feats["b"], "c": feats["b"]}, ValueError, "table 'c' is not in"),
                    ({"a": (feats["a"][0], feats["a"][1], torch.ones(2)), "b": feats["b"]}, ValueError,
                     "table 'a': per_sample_weights has shape"),
                    ({"a": (feats["a"][0], feats["a"][1], feats["a"][2].clone().requires_grad_()), "b": feats["b"]},
                     ValueError, "table 'a': per_sample_weights require a gradient"),
                    ({"a": (feats["a"][0], feats["a"][1], feats["a"][2] * float("nan")), "b": feats["b"]},
                     ValueError, "table 'a': per_sample_weights hold NaN or Inf"),
                    ([feats["a"]], TypeError, "features must be a mapping"),
                ]
                for bad, kind, text in cases:
                    with self.assertRaises(kind) as cm:
                        w.step(bad, x, y)
                    self.assertIn(text, str(cm.exception))
                after = w.session.client.server_counters(0)
                # Nothing reached the server but the Stats request itself.
                self.assertEqual(after["messages"] - before["messages"], 1)
                # And the worker still trains.
                w.step(feats, x, y)
                with self.assertRaises(ValueError) as cm:
                    ft.EmbeddingBagConfig("z", 4, optimizer="lamb")
                self.assertIn("table 'z': optimizer 'lamb'", str(cm.exception))
            finally:
                w.session.close()

    def test_a_server_killed_mid_step_is_named(self):
        batches = make_batches(61, 3, 8)
        with Servers(2) as s:
            w = Worker(s.endpoints, 0, 1, "sgd", 0.05, "kill/")
            try:
                w.step(*batches[0])
                feats, x, y = batches[1]
                loss = torch.nn.functional.mse_loss(model_out(w.ebc(feats), x, w.linear), y)
                s.procs[1].kill()
                s.procs[1].wait()
                with self.assertRaises(ferry.Error) as cm:
                    loss.backward()
                    w.step(*batches[2])
                self.assertEqual(cm.exception.code, "UNAVAILABLE")
                self.assertIn(s.endpoints[1], str(cm.exception))
            finally:
                w.session.close()


def late_drops(session, server=0):
    return session.client.server_counters(server).get("late_gradients_dropped", 0)


class StepsTest(unittest.TestCase):
    """The step bookkeeping around what users do: tables of several consistencies in one
    collection, evaluation forwards and skipped backwards while reading ahead, a worker that
    joins a job in progress, ssp resumed from a checkpoint, a table the loss does not reach, a
    failed push, a failed backward, parameters the client cannot use in place."""

    def session(self, s, **kw):
        return ft.init(s.endpoints, 0, 1, request_timeout=60, **kw)

    @contextlib.contextmanager
    def one_worker(self, *args, **kwargs):
        """Servers(*args, **kwargs) and one worker's session on them, closed at the end."""
        with Servers(*args, **kwargs) as s:
            ses = self.session(s)
            try:
                yield s, ses
            finally:
                ses.close()

    def test_sync_and_async_tables_in_one_collection_keep_the_sync_step(self):
        # An async table's version counts its updates, not steps: it must not set the sync step.
        with self.one_worker(1) as (s, ses):
            ebc = ft.EmbeddingBagCollection([ft.EmbeddingBagConfig("s", 4, consistency="sync"),
                                             ft.EmbeddingBagConfig("a", 4, consistency="async")], prefix="mx/")
            ids = torch.tensor([[1], [2]])
            for step in range(6):
                out = ebc({"s": ids} if step < 3 else {"s": ids, "a": ids})
                sum(v.sum() for v in out.values()).backward()
                ebc.flush()
                self.assertEqual(ebc.step, step + 1)
            self.assertEqual(late_drops(ses), 0)

    def test_reading_ahead_survives_evaluation_and_a_skipped_backward(self):
        batches = [{"s": torch.tensor([[i], [i + 100]])} for i in range(20)]
        with self.one_worker(1, max_wait_s=20) as (s, ses):
            ebc = ft.EmbeddingBagCollection([ft.EmbeddingBagConfig("s", 4)], prefix="ra/")
            pushed = 0
            for i, b in enumerate(ft.Prefetcher(batches, ebc, lambda b: b)):
                loss = ebc(b)["s"].sum()
                if i == 7:
                    continue  # a batch skipped after its forward (say, a non-finite loss)
                loss.backward()
                pushed += 1
                if i == 4:
                    with torch.no_grad():  # evaluation between steps reads, and leaves the queue
                        ebc({"s": torch.tensor([[999]])})
            ebc.flush()
            self.assertEqual(ebc.step, pushed)
            self.assertEqual(late_drops(ses), 0)
            # Every forward took its rows read ahead but the two after the skipped batch, whose
            # reads ahead asked for a step one too far (the skipped one was never pushed).
            self.assertEqual(ebc.stats["pulls_taken_ahead"], len(batches) - 2)

    def test_a_worker_joining_a_job_in_progress_reads_ahead_at_the_jobs_step(self):
        batches = [{"s": torch.tensor([[i], [i + 1]])} for i in range(8)]
        with Servers(1, max_wait_s=20) as s:
            ses = self.session(s)
            ebc = ft.EmbeddingBagCollection([ft.EmbeddingBagConfig("s", 4)], prefix="rj/")
            for b in batches[:5]:
                ebc(b)["s"].sum().backward()
            ebc.flush()
            ses.close()
            ses = self.session(s, env={"FERRY_RESUME": "1"})  # restarted: the servers are at step 5
            try:
                ebc = ft.EmbeddingBagCollection([ft.EmbeddingBagConfig("s", 4)], prefix="rj/")
                self.assertEqual((ebc.step, ses.start_step), (5, 5))
                for b in ft.Prefetcher(batches, ebc, lambda b: b):
                    ebc(b)["s"].sum().backward()
                ebc.flush()
                self.assertEqual(ebc.step, 5 + len(batches))
                self.assertEqual(late_drops(ses), 0)
            finally:
                ses.close()

    def test_a_restarted_async_worker_resumes_at_its_own_step(self):
        # Async tables count this worker's own steps: a worker restarted alone (the servers alive,
        # no checkpoint) resumes at the steps of its own the servers took (Client.worker_step), and
        # says so as the launcher reads it. Before, it began again at step 0 (restored_step).
        cfg = [ft.EmbeddingBagConfig("a", 4, consistency="async")]
        b = {"a": torch.tensor([[1], [2]])}
        with Servers(1, max_wait_s=20) as s:
            ses = self.session(s)
            ebc = ft.EmbeddingBagCollection(cfg, prefix="own/")
            dense = ft.ServerParameters(torch.nn.Linear(2, 1), session=ses, prefix="own-d/", consistency="async")
            for _ in range(7):
                (ebc(b)["a"].sum() + dense(torch.ones(1, 2)).sum()).backward()
            ebc.flush()
            dense.flush()
            ses.close()
            out = io.StringIO()
            with contextlib.redirect_stdout(out):  # the session's lines
                ses = ft.init(s.endpoints, 0, 1, request_timeout=60, env={"FERRY_RESUME": "1"})
            try:
                ebc = ft.EmbeddingBagCollection(cfg, prefix="own/")
                dense = ft.ServerParameters(torch.nn.Linear(2, 1), session=ses, prefix="own-d/", consistency="async")
                self.assertEqual((ses.worker_step, ebc.step, ses.start_step), (7, 7, 7))
                ses.resuming(ses.start_step, 20)
                self.assertIn("[worker 0] resuming the job at step 7 of 20 of its own", out.getvalue())
            finally:
                ses.close()

    def test_ssp_resumes_from_a_checkpoint(self):
        cfg = [ft.EmbeddingBagConfig("e", 4, consistency="ssp:2")]
        b = {"e": torch.tensor([[1], [2]])}

        def train(sessions, steps):
            ebcs = [ft.EmbeddingBagCollection(cfg, prefix="ssp/", session=x) for x in sessions]

            def run(r):
                for _ in range(steps):
                    ebcs[r](b)["e"].sum().backward()
                ebcs[r].flush()
            run_workers(self, run, 2, 60)
            return ebcs

        with tempfile.TemporaryDirectory() as d:
            with Servers(1, extra_args=["--checkpoint-dir", d, "--num-workers", "2"]) as s:
                sessions = [ft.init(s.endpoints, r, 2, request_timeout=60) for r in range(2)]
                train(sessions, 10)
                sessions[0].checkpoint(10)
                for x in sessions:
                    x.close()
            with Servers(1, max_wait_s=20, extra_args=["--checkpoint-dir", d, "--num-workers", "2",
                                                       "--restore"]) as s:
                sessions = [ft.init(s.endpoints, r, 2, request_timeout=60, env={"FERRY_RESUME": "1"})
                            for r in range(2)]
                try:
                    ebcs = train(sessions, 3)
                    self.assertEqual([x.start_step for x in sessions], [10, 10])
                    self.assertEqual([e.step for e in ebcs], [13, 13])
                finally:
                    for x in sessions:
                        x.close()

    def test_server_parameters_train_two_ssp_workers(self):
        # ssp:1 dense tables: each push+pull advances the worker's clock; neither worker may run
        # more than a step ahead, and both end with every step pushed.
        with Servers(1, max_wait_s=20) as s:
            sessions = [ft.init(s.endpoints, r, 2, request_timeout=60) for r in range(2)]
            try:
                mods = [ft.ServerParameters(torch.nn.Linear(4, 1), session=x, prefix="sspd/", consistency="ssp:1")
                        for x in sessions]
                first = {}

                def run(r):
                    g = torch.Generator().manual_seed(r)
                    for step in range(20):
                        x = torch.randn(16, 4, generator=g)
                        loss = ((mods[r](x) - x.sum(1, keepdim=True)) ** 2).mean()
                        first.setdefault(r, float(loss))
                        loss.backward()
                    mods[r].flush()
                run_workers(self, run, 2, 60)
                self.assertEqual([m.step for m in mods], [20, 20])
                x = torch.randn(64, 4)
                with torch.no_grad():  # the servers' values after both workers' 40 updates
                    final = float(((mods[0](x) - x.sum(1, keepdim=True)) ** 2).mean())
                self.assertLess(final, min(first.values()))
            finally:
                for x in sessions:
                    x.close()

    def test_a_table_the_loss_does_not_reach_is_not_updated(self):
        with self.one_worker(1) as (s, ses):
            ebc = ft.EmbeddingBagCollection([ft.EmbeddingBagConfig(n, 4, optimizer="adam", lr=0.1) for n in "ab"],
                                            prefix="uo/")
            f = {"a": torch.tensor([[1], [2]]), "b": torch.tensor([[1], [2]])}
            out = ebc(f)
            (out["a"].sum() + out["b"].sum()).backward()

            def rows(t):
                ebc.flush()
                return ses.client.pull_sparse("uo/" + t, np.array([1, 2]), step=ebc.step).wait().copy()
            a0, b0 = rows("a"), rows("b")
            for _ in range(3):
                ebc(f)["a"].sum().backward()  # as nn.EmbeddingBag + Adam: b has no gradient
            self.assertTrue(np.array_equal(rows("b"), b0))
            self.assertFalse(np.array_equal(rows("a"), a0))

    def test_a_refused_sync_push_is_named_and_the_worker_goes_on(self):
        with self.one_worker(2, max_wait_s=20) as (s, ses):
            ebc = ft.EmbeddingBagCollection([ft.EmbeddingBagConfig("s", 4)], prefix="nan/")
            ids, offsets = torch.arange(16), torch.arange(16)
            # A NaN reaches one row's gradient: its server refuses the push, the other applies it.
            (ebc({"s": (ids, offsets)})["s"] * torch.where(ids == 3, float("nan"), 1.0)[:, None]).sum().backward()
            with self.assertRaises(ferry.Error) as cm:
                ebc({"s": (ids, offsets)})
            self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")
            self.assertIn("nan/s", str(cm.exception))
            for _ in range(3):  # the step is taken again, and the job goes on
                ebc({"s": (ids, offsets)})["s"].sum().backward()
            ebc.flush()
            self.assertEqual(ebc.step, 3)

    def test_server_parameters_push_again_after_a_failed_backward(self):
        class FailOnce(torch.autograd.Function):
            fail = True

            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, g):
                if FailOnce.fail:
                    FailOnce.fail = False
                    raise RuntimeError("a failure in backward")
                return g

        with self.one_worker(1, max_wait_s=20) as (s, ses):
            lin = ft.ServerParameters(torch.nn.Linear(3, 1), prefix="stuck/")
            x = torch.ones(2, 3)
            with self.assertRaises(RuntimeError):
                (lin(x) + FailOnce.apply(torch.ones(2, 1, requires_grad=True))).sum().backward()
            before = lin.module.weight.detach().clone()
            for _ in range(2):
                (lin(x) + FailOnce.apply(torch.ones(2, 1, requires_grad=True))).sum().backward()
            lin.flush()
            self.assertEqual(lin.step, 2)
            lin(x)
            self.assertFalse(torch.equal(lin.module.weight.detach(), before))

    def test_server_parameters_state_dict_after_backward_holds_the_next_values(self):
        with self.one_worker(1) as (s, ses):
            model = torch.nn.Sequential(ft.ServerParameters(torch.nn.Linear(3, 2), prefix="sd/"))
            x = torch.ones(4, 3)
            model(x).sum().backward()
            model(x)
            stop(s.procs[0])  # the next push+pull's reply cannot come
            try:
                model(x).sum().backward()
                got = {}
                reader = threading.Thread(target=lambda: got.update(model.state_dict()))
                reader.start()
                reader.join(timeout=0.5)
                self.assertTrue(reader.is_alive(), "state_dict() did not wait for the push+pull in flight")
            finally:
                s.procs[0].send_signal(signal.SIGCONT)
            reader.join(timeout=60)
            self.assertFalse(reader.is_alive())
            state = got  # nested: the wrapper's own state_dict waited first
            for n in ("weight", "bias"):
                want = np.empty(tuple(state["0.module." + n].shape), np.float32)
                ses.client.pull_dense_tables([("sd/" + n, want)], 2).wait()
                self.assertTrue(torch.equal(state["0.module." + n], torch.from_numpy(want)), n)

    def test_server_parameters_the_client_cannot_use_in_place(self):
        with self.one_worker(1) as (s, ses):
            m = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 2), torch.nn.Flatten(), torch.nn.Linear(12, 1))
            m = m.to(memory_format=torch.channels_last)  # the conv weight is not contiguous
            self.assertFalse(m[0].weight.is_contiguous())
            sp = ft.ServerParameters(m, prefix="stg/", init="constant", init_scale=0.5)
            sp(torch.ones(1, 2, 3, 3)).sum().backward()
            sp(torch.ones(1, 2, 3, 3))
            for n, p in m.named_parameters():
                want = np.empty(tuple(p.shape), np.float32)
                ses.client.pull_dense_tables([("stg/" + n, want)], sp.step).wait()
                self.assertTrue(torch.equal(p.detach(), torch.from_numpy(want)), n)
                self.assertFalse(torch.all(p == 0.5), n)  # trained a step

    def test_every_table_of_a_step_travels_in_one_message_per_server_each_way(self):
        with Servers(2) as s:
            ses = ft.init(s.endpoints, 0, 1, request_timeout=60, heartbeat_timeout=0)  # counts exact
            try:
                ebc = ft.EmbeddingBagCollection([ft.EmbeddingBagConfig(n, d) for n, d in (("a", 4), ("b", 4), ("c", 8))],
                                                prefix="msg/")
                lin = ft.ServerParameters(torch.nn.Linear(16, 1), prefix="msg/dense/")
                feats = {n: torch.randint(0, 1000, (64, 3)) for n in "abc"}

                def step():
                    pooled = ebc(feats)
                    lin(torch.cat([pooled["a"], pooled["b"], pooled["c"]], 1)).sum().backward()

                step()  # the first step also pulls the dense values once
                ebc.flush()
                lin.flush()

                def messages():
                    return [ses.client.server_counters(r)["messages"] for r in range(2)]
                before = messages()
                for _ in range(3):
                    step()
                ebc.flush()
                lin.flush()
                # Per step and server: one pull of the three tables, one push of them, one dense
                # push+pull; plus the Stats request of messages() itself.
                self.assertEqual([a - b for a, b in zip(messages(), before)], [3 * 3 + 1] * 2)
            finally:
                ses.close()

    def test_a_bad_batch_read_ahead_raises_at_its_own_step(self):
        batches = [{"s": torch.tensor([[1], [2]])}, {"s": torch.tensor([[1.5], [2.5]])}, {"s": torch.tensor([[3]])}]
        with self.one_worker(1) as (s, ses):
            ebc = ft.EmbeddingBagCollection([ft.EmbeddingBagConfig("s", 4)], prefix="bb/")
            trained = []
            with self.assertRaises(TypeError) as cm:
                for i, b in enumerate(ft.Prefetcher(batches, ebc, lambda b: b)):
                    ebc(b)["s"].sum().backward()
                    trained.append(i)
            self.assertEqual(trained, [0])  # batch 0 trained; batch 1's own forward raised
            self.assertIn("table 's': ids must be int64", str(cm.exception))

    def test_ids_written_in_place_after_reading_ahead_are_read_again(self):
        with self.one_worker(1) as (s, ses):
            ebc = ft.EmbeddingBagCollection([ft.EmbeddingBagConfig("a", 4, consistency="async")], prefix="ip/")
            ids = torch.tensor([[5], [6]])
            ebc.prefetch({"a": ids})
            ids[1, 0] = 7  # the batch changed after its rows were read ahead
            got = ebc({"a": ids})["a"]
            want = torch.from_numpy(ses.client.pull_sparse("ip/a", np.array([5, 7])).wait())
            self.assertTrue(torch.equal(got, want))
            self.assertEqual(ebc.stats["pulls_taken_ahead"], 0)

    def test_rows_read_ahead_are_not_taken_by_another_table(self):
        with self.one_worker(1) as (s, ses):
            ebc = ft.EmbeddingBagCollection([ft.EmbeddingBagConfig(n, 4, consistency="async", seed=i + 1)
                                             for i, n in enumerate("ab")], prefix="wt/")
            ids = torch.tensor([[5], [6]])
            ebc.prefetch({"a": ids})
            got = ebc({"b": ids})["b"]
            want = torch.from_numpy(ses.client.pull_sparse("wt/b", np.array([5, 6])).wait())
            self.assertTrue(torch.equal(got, want))
            self.assertEqual(ebc.stats["pulls_taken_ahead"], 0)


if __name__ == "__main__":
    unittest.main()
