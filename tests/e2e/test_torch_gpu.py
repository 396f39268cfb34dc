"""ferry.torch with the model on a GPU, against real ferry-ps processes on 127.0.0.1: the ids,
the dense features and the server-held linear layer on the GPU (the rows and parameters travel
through the host), as test_torch.py's runs on the CPU. Each run must follow a pure-PyTorch
reference on the CPU step by step, and a sync run of two workers sharing the GPU must repeat its
bits. Skipped, saying so, where torch sees no CUDA GPU (bench/gpu/torch_front.sh runs it on one).

FERRY_TORCH_TEST_DEVICE=cpu runs the same checks with the model on the CPU (this file's own test
where there is no GPU). Run by hand, from tests/e2e/:
    FERRY_BUILD_DIR=../../build /usr/bin/python3 -m unittest -v test_torch_gpu
"""

import os
import unittest

import torch

from test_sync_cluster import Servers
from test_torch import (TABLES, LazyReference, Worker, make_batches, max_rel, reference_start, reference_step,
                        run_workers, split)

DEVICE = torch.device(os.environ.get("FERRY_TORCH_TEST_DEVICE", "cuda"))
NO_DEVICE = (f"no CUDA GPU: torch {torch.__version__} sees none (torch.cuda.is_available() is False); "
             "FERRY_TORCH_TEST_DEVICE=cpu runs these checks on the CPU")


@unittest.skipUnless(DEVICE.type != "cuda" or torch.cuda.is_available(), NO_DEVICE)
class TorchOnGpuTest(unittest.TestCase):
    def setUp(self):
        torch.use_deterministic_algorithms(True)
        if DEVICE.type == "cuda":
            print(f"\n  on {torch.cuda.get_device_name(DEVICE)}, torch {torch.__version__}", flush=True)

    def tearDown(self):
        torch.use_deterministic_algorithms(False)

    def test_one_sync_worker_on_the_gpu_follows_the_cpu_reference(self):
        # SGD, then Adam as the servers apply it (LazyReference): each step's loss, computed on the
        # GPU, within 1e-5 of the CPU reference's, and the servers' tables within 1e-5 at the end.
        for optimizer, lr in (("sgd", 0.05), ("adam", 0.01)):
            with self.subTest(optimizer=optimizer), Servers(2) as s:
                w = Worker(s.endpoints, 0, 1, optimizer, lr, f"gpu_{optimizer}/", device=DEVICE)
                try:
                    bags, linear = reference_start(w)
                    start = {n: b.weight.detach().clone() for n, b in bags.items()}
                    if optimizer == "sgd":
                        opt = torch.optim.SGD(list(linear.parameters()) + [b.weight for b in bags.values()], lr=lr)
                    else:
                        opt = LazyReference(optimizer, lr)
                    for step, (feats, x, y) in enumerate(make_batches(13, 40, 16)):
                        got = w.step(feats, x, y)
                        want = reference_step(bags, linear, opt, feats, x, y)
                        self.assertAlmostEqual(got, want, delta=1e-5 * max(1.0, abs(want)), msg=f"step {step}")
                    rows, dense = w.values()
                    for n in bags:
                        self.assertLessEqual(max_rel(rows[n], bags[n].weight.detach()), 1e-5, f"table {n}")
                        self.assertGreater(max_rel(rows[n], start[n]), 1e-3, f"table {n} did not train")
                    for name, p in linear.named_parameters():
                        self.assertLessEqual(max_rel(dense[name], p.detach()), 1e-5, f"dense {name}")
                    # The module's own parameters, on the GPU, hold what the servers hold.
                    for name, p in w.linear.module.named_parameters():
                        self.assertEqual(p.device, w.device)
                        self.assertTrue(torch.equal(p.detach().cpu(), dense[name]), f"dense {name} on the device")
                finally:
                    w.session.close()

    def test_two_sync_workers_sharing_the_gpu_take_one_processs_steps_and_repeat_their_bits(self):
        steps, batch = 25, 8
        batches = make_batches(23, steps, 2 * batch)
        finals = []
        for run in range(2):
            with Servers(2) as s:
                workers = [Worker(s.endpoints, r, 2, "adagrad", 0.05, "gpu_two/", device=DEVICE) for r in range(2)]
                try:
                    if run == 0:
                        bags, linear = reference_start(workers[0])
                    results = {}

                    def work(r):
                        for feats, x, y in batches:
                            workers[r].step(*split(feats, x, y, r, 2))
                        results[r] = workers[r].values()
                    run_workers(self, work, 2, 180)
                    finals.append(results[0])
                finally:
                    for w in workers:
                        w.session.close()
        opt = LazyReference("adagrad", 0.05)
        for feats, x, y in batches:
            reference_step(bags, linear, opt, feats, x, y)
        for n, _, _ in TABLES:
            self.assertLessEqual(max_rel(finals[0][0][n], bags[n].weight.detach()), 1e-5, f"table {n}")
            self.assertTrue(torch.equal(finals[0][0][n], finals[1][0][n]), f"table {n}: the second run's bits differ")
        for name, p in linear.named_parameters():
            self.assertLessEqual(max_rel(finals[0][1][name], p.detach()), 1e-5, f"dense {name}")
            self.assertTrue(torch.equal(finals[0][1][name], finals[1][1][name]), f"dense {name}: bits differ")


if __name__ == "__main__":
    unittest.main()
