"""ferry.torch's dedup against torch.unique (bench/results/HISTORY.md "PyTorch on Ferry"): the ids of one
ctr batch (8 fields x 512 examples of the planted data), deduplicated per table, ROUNDS rounds
alternating the two ways, N calls each; prints per round the ms per batch of each and their ratio.

  PYTHONPATH=build/python /usr/bin/python3 bench/results/torch_dlrm/dedup.py [ROUNDS] [N]
"""
import sys
import time

import torch

from ferry import _ferry
from ferry.torch.data import SyntheticCtrDataset

torch.set_num_threads(1)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
ids = next(iter(SyntheticCtrDataset(512, num_examples=200_000, steps=1)))["ids"]
columns = [ids[:, f].contiguous() for f in range(ids.shape[1])]
arrays = [c.numpy() for c in columns]


def torch_unique():
    for c in columns:
        torch.unique(c, sorted=True, return_inverse=True)


def ferry_dedup():
    _ferry.dedup(arrays)


print("round | torch.unique x8 ms | ferry dedup ms | torch/ferry")
for r in range(1, rounds + 1):
    t = {}
    for name, fn in (("torch", torch_unique), ("ferry", ferry_dedup)) if r % 2 else \
            (("ferry", ferry_dedup), ("torch", torch_unique)):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t[name] = (time.perf_counter() - t0) / n * 1e3
    print(f"{r} | {t['torch']:.4f} | {t['ferry']:.4f} | {t['torch'] / t['ferry']:.2f}")
