#!/usr/bin/python3
"""Ferry from PyTorch in 45 lines: a click-through model whose embedding tables and MLP live on
Ferry's servers. Run it on 2 servers x 2 workers (README, "Using Ferry from PyTorch"):

    launch/ferry-launch --num-ps 2 --num-workers 2 -- /usr/bin/python3 examples/quickstart.py
"""
import torch
import ferry.torch as ft
from ferry.torch.data import SyntheticCtrDataset

session = ft.init()  # servers, rank and worker count from ferry-launch's environment
fields = [f"field{f}" for f in range(8)]
# One sparse table per field, updated by the servers with Adam (sync: exact, every worker's
# gradients averaged each step); rows made on first touch.
emb = ft.EmbeddingBagCollection(
    [ft.EmbeddingBagConfig(f, 16, optimizer="adam", lr=0.002, consistency="sync") for f in fields])
# The MLP's parameters are dense tables on the servers too; no optimizer on the worker.
mlp = ft.ServerParameters(torch.nn.Sequential(torch.nn.Linear(8 * 16 + 4, 64), torch.nn.ReLU(),
                                              torch.nn.Linear(64, 1)), optimizer="adam", lr=0.002)
data = SyntheticCtrDataset(512, num_examples=200_000, steps=300, shard_index=session.rank,
                           num_shards=session.num_workers)



def features(batch):  # field f's bags: one id per example, [batch, 1]
    return {f: batch["ids"][:, i:i + 1] for i, f in enumerate(fields)}


# The Prefetcher pulls the next batch's rows while this step computes.
for step, batch in enumerate(ft.Prefetcher(data, emb, features)):
    pooled = emb(features(batch))  # the rows of this batch, pooled per field: {field: [512, 16]}
    logits = mlp(torch.cat([pooled[f] for f in fields] + [batch["dense"]], dim=1)).squeeze(1)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch["labels"])
    loss.backward()  # pushes every table's gradients; the servers apply Adam
    if (step + 1) % 100 == 0:
        session.log_step(step + 1, len(data), loss=float(loss))
session.finish()
session.close()
