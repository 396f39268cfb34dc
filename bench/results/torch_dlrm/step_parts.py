"""Where a ferry.torch step of the ctr model goes (bench/results/HISTORY.md "PyTorch on Ferry"): the
Python path of examples/dlrm.py --arch ctr (8 tables of dim 16, a 132-64-32-1 tower, batch 512,
Adam on the servers) against one ferry-ps on 127.0.0.1, every part of the loop timed apart over
500 steps after 100 of warm-up; then the tower alone in torch (forward + backward, no servers).
One compute thread. ROUNDS runs, each a fresh server; prints ms per step per part and round.

  PYTHONPATH=build/python /usr/bin/python3 bench/results/torch_dlrm/step_parts.py build [ROUNDS]
"""
import collections
import os
import re
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "examples"))
import dlrm  # noqa: E402
import ferry.torch as ft  # noqa: E402
from ferry.torch import data as fdata  # noqa: E402

build = sys.argv[1] if len(sys.argv) > 1 else "build"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
torch.set_num_threads(1)
args = dlrm.parse_args(["--arch", "ctr", "--threads", "1"])
fields = [f"emb{f}" for f in range(8)]
PARTS = ("data", "features", "embeddings", "tower_forward", "loss", "backward")


def one_round(r):
    ps = subprocess.Popen([os.path.join(build, "bin", "ferry-ps"), "--bind", "tcp://127.0.0.1:0",
                           "--compute-threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        endpoint = re.search(r"(tcp://\S+)", ps.stdout.readline()).group(1)
        session = ft.init([endpoint], 0, 1)
        emb = ft.EmbeddingBagCollection([ft.EmbeddingBagConfig(f, 16, optimizer="adam", lr=0.002) for f in fields])
        tower = ft.ServerParameters(dlrm.make_tower(*dlrm.dense_widths(args, 4, fields)), optimizer="adam", lr=0.002)
        train = iter(fdata.SyntheticCtrDataset(512, num_examples=200_000, steps=600))
        loss_fn = torch.nn.BCEWithLogitsLoss()
        t = collections.Counter()
        for step in range(600):
            if step == 100:
                t.clear()
                t0 = time.perf_counter()
                stats0 = (dict(emb.stats), dict(tower.stats))
            a = time.perf_counter()
            batch = next(train)
            b = time.perf_counter()
            feats = dlrm.features_of(batch, fields)
            c = time.perf_counter()
            pooled = emb(feats)
            d = time.perf_counter()
            logits = tower(batch["dense"], [pooled[f] for f in fields])
            e = time.perf_counter()
            loss = loss_fn(logits, batch["labels"])
            f = time.perf_counter()
            loss.backward()
            g = time.perf_counter()
            for k, v in zip(PARTS, (b - a, c - b, d - c, e - d, f - e, g - f)):
                t[k] += v
        n = 500
        total = time.perf_counter() - t0
        e1, t1 = emb.stats, tower.stats
        inner = {"of embeddings: pull wait": e1["pull_s"] - stats0[0]["pull_s"],
                 "of embeddings: push wait": e1["push_wait_s"] - stats0[0]["push_wait_s"],
                 "of backward: sparse push send": e1["push_send_s"] - stats0[0]["push_send_s"],
                 "of backward: dense push+pull send": t1["exchange_send_s"] - stats0[1]["exchange_send_s"],
                 "of tower_forward: dense wait": t1["exchange_wait_s"] - stats0[1]["exchange_wait_s"]}
        session.close()
    finally:
        ps.kill()
        ps.wait()
    row = {"step": total / n * 1e3, **{k: v / n * 1e3 for k, v in t.items()},
           **{k: v / n * 1e3 for k, v in inner.items()}}
    return row


def tower_alone():
    m = dlrm.make_tower(*dlrm.dense_widths(args, 4, fields))
    x = [torch.randn(512, 16) for _ in fields]
    dense, y = torch.randn(512, 4), torch.rand(512)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for i in range(600):
        if i == 100:
            t0 = time.perf_counter()
        loss_fn(m(dense, x), y).backward()
    return (time.perf_counter() - t0) / 500 * 1e3


rows = [one_round(r) for r in range(rounds)]
for k in rows[0]:
    print(f"{k:36s} " + " ".join(f"{row[k]:7.3f}" for row in rows))
print(f"{'tower alone, forward+backward (torch)':36s} " + " ".join(f"{tower_alone():7.3f}" for _ in range(rounds)))
