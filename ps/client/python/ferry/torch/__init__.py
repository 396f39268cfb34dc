"""ferry.torch: Ferry's tables behind PyTorch modules (python3-torch).

    import ferry.torch as ft
    session = ft.init()                           # from ferry-launch's environment or TF_CONFIG
    ebc = ft.EmbeddingBagCollection([ft.EmbeddingBagConfig("user", 16, optimizer="adagrad", lr=0.05)])
    mlp = ft.ServerParameters(torch.nn.Linear(16, 1), optimizer="sgd", lr=0.1)
    for batch in ft.Prefetcher(loader, ebc, lambda b: {"user": b["user"]}):
        loss = f(mlp(ebc({"user": batch["user"]})["user"]), batch["label"])
        loss.backward()                           # pushes; the servers apply the optimizers

- init / Session (session.py): the worker's place in the job, checkpoints, the launcher's lines.
- EmbeddingBagCollection / EmbeddingBagConfig / Bags (embedding.py): sparse tables, pooled.
- ServerParameters (dense.py): a module's parameters as dense tables.
- Prefetcher (prefetch.py): the next batch's rows pulled while a step computes.
- ferry.torch.data: the Criteo reader and the planted-model CTR data as IterableDatasets.
"""

from .dense import ServerParameters  # noqa: F401
from .embedding import Bags, EmbeddingBagCollection, EmbeddingBagConfig  # noqa: F401
from .prefetch import Prefetcher  # noqa: F401
from .session import Session, default_session, init  # noqa: F401

__all__ = ["Bags", "EmbeddingBagCollection", "EmbeddingBagConfig", "Prefetcher", "ServerParameters", "Session",
           "default_session", "init"]
