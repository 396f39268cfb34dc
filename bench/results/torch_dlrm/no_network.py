"""The ctr step of ferry.torch with no network (bench/results/HISTORY.md "PyTorch on Ferry"): the same
loop as ctr_py_1x1 against a stand-in client whose calls are done at once, beside the same model
with torch's own nn.EmbeddingBag modules (no optimizer either) and the tower alone; ROUNDS (7)
alternating the three, 300 steps each after 50 of warm-up, one thread. What it shows: the cost of
ferry.torch's own work in a step, apart from the network and from the server's threads.

  /usr/bin/python3 bench/results/torch_dlrm/no_network.py [BUILD] [ROUNDS]
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "..", "build")
sys.path.insert(0, os.path.join(BUILD, "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "examples"))
import torch  # noqa: E402
import ferry.torch as ft  # noqa: E402
from ferry.torch import session as S, data as fdata  # noqa: E402
import dlrm  # noqa: E402
torch.set_num_threads(1)

class H:
    """A handle that is done at once."""
    version = -1
    def wait(self, timeout=None): return None
    def done(self): return True
class MockClient:
    """ferry.Client's calls that ferry.torch makes, answering at once (no rows are written)."""
    rank, num_workers, num_servers, restored_step = 0, 1, 1, 0
    def declare_sparse(self, **kw): pass
    def declare_dense(self, **kw): pass
    def pull_sparse_tables(self, entries, step, distinct=False): return H()
    def push_sparse_tables(self, entries, step, distinct=False): return H()
    def pull_dense_tables(self, entries, step): return H()
    def push_pull_dense_tables(self, entries, step): return H()
    def advance_clock(self, c, wait=True): return H()
    def close(self): pass
sess = S.Session(MockClient())
fields = [f"emb{f}" for f in range(8)]
args = dlrm.parse_args(["--arch", "ctr"])
emb = ft.EmbeddingBagCollection([ft.EmbeddingBagConfig(f, 16) for f in fields], session=sess)
tower = ft.ServerParameters(dlrm.make_tower(*dlrm.dense_widths(args, 4, fields)), session=sess)
local_tower = dlrm.make_tower(*dlrm.dense_widths(args, 4, fields))
batches = list(fdata.SyntheticCtrDataset(512, num_examples=200000, steps=50, read_ahead=False))
lossf = torch.nn.BCEWithLogitsLoss()
def run(n, fn):
    for i in range(n):
        fn(batches[i % 50])
def ferry_step(b):
    pooled = emb(dlrm.features_of(b, fields))
    lossf(tower(b["dense"], [pooled[f] for f in fields]), b["labels"]).backward()
bags = {f: torch.nn.EmbeddingBag(1000 * 8, 16) for f in fields}
def torch_step(b):  # the same model with local EmbeddingBags, no optimizer
    f = dlrm.features_of(b, fields)
    pooled = [bags[k](f[k]) for k in fields]
    lossf(local_tower(b["dense"], pooled), b["labels"]).backward()
def tower_only(b):
    pooled = [torch.zeros(512, 16) for _ in fields]
    lossf(local_tower(b["dense"], pooled), b["labels"]).backward()
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 7
for r in range(ROUNDS):
    for name, fn in (("ferry.torch, no network", ferry_step), ("torch EmbeddingBag", torch_step), ("tower only", tower_only)):
        run(50, fn)
        t = time.perf_counter(); run(300, fn); print(r, name, round((time.perf_counter() - t) / 300 * 1e3, 3), "ms")
