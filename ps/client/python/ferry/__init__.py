"""Ferry's parameter-server client for Python.

    import ferry, numpy as np
    c = ferry.Client(["tcp://127.0.0.1:7470"], rank=0, num_workers=1)
    c.declare_sparse("emb", 16, optimizer="adagrad", lr=0.05)
    rows = c.pull_sparse("emb", np.array([3, 9, 3]), step=0).wait()

The client itself is the extension module ferry._ferry (pybind11, over the C++ client); this
package re-exports it. ferry.ChangeFeed follows tables as a job trains them (a serving copy).
ferry.torch puts Ferry's tables behind PyTorch modules (it needs
python3-torch and is imported only when asked for).
"""

from ._ferry import (PLACEMENT_SLOTS, ChangeFeed, Client, Error, Handle, WorkerMetrics,  # noqa: F401
                     ask_move, cluster_from_tf_config, id_server, optimizers, table_option_keys)

# Errors read as ferry.Error (the class lives in the extension).
Error.__module__ = "ferry"

__all__ = ["PLACEMENT_SLOTS", "ChangeFeed", "Client", "Error", "Handle", "WorkerMetrics", "ask_move",
           "cluster_from_tf_config", "id_server", "optimizers", "table_option_keys"]
