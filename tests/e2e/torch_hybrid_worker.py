"""A worker of test_torch's hybrid test (PERSIA's layout): dense layers on the workers under
torch.nn.parallel.DistributedDataParallel (gloo), embedding bags on Ferry's servers (sync).

  torch_hybrid_worker.py SERVERS RANK STORE_PORT STEPS BATCH OUT
trains STEPS steps on its half of test_torch.make_batches(71, STEPS, 2 * BATCH) and, on rank 0,
saves the servers' rows and the local dense parameters to OUT (torch.save).
"""

import sys

import torch
import torch.distributed as dist

import test_torch as T

import ferry.torch as ft


def main():
    servers, rank, port, steps, batch, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), \
        int(sys.argv[5]), sys.argv[6]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    session = ft.init(servers, rank, 2, request_timeout=60)
    cfgs = [ft.EmbeddingBagConfig(n, d, pooling=p, optimizer="sgd", lr=0.05, init="uniform", init_scale=0.5, seed=3)
            for n, d, p in T.TABLES]
    ebc = ft.EmbeddingBagCollection(cfgs, prefix="hybrid/")
    torch.manual_seed(5)
    linear = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(T.DENSE_IN, 1))
    opt = torch.optim.SGD(linear.parameters(), lr=0.05)
    for feats, x, y in T.make_batches(71, steps, 2 * batch):
        feats, x, y = T.split(feats, x, y, rank, 2)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(T.model_out(ebc(feats), x, linear), y)
        loss.backward()
        opt.step()
    ebc.flush()
    if rank == 0:
        ids = torch.arange(T.VOCAB).numpy()
        rows = {n: torch.from_numpy(session.client.pull_sparse(ebc.server_name(n), ids, step=ebc.step).wait())
                for n, _, _ in T.TABLES}
        torch.save({"rows": rows, "dense": {k: v.detach() for k, v in linear.module.named_parameters()}}, out)
    session.finish()
    session.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
