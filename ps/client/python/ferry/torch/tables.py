"""Table settings shared by the modules of ferry.torch: one place that turns a table's settings
(the names and defaults of ferry-trainer's --table and flags) into a declaration, and that keeps
a group of tables' steps.

Defaults (as ferry-trainer's): optimizer sgd, lr 0.1, consistency sync, wire f32. The other
keys, as in --table (ferry.table_option_keys()): the optimizer's hyperparameters (ferry.optimizers()
lists each optimizer's), admit_after, admit_probability, evict_after_steps, max_rows (a sparse
table's row lifecycle), disk_tier (with max_rows: the rows beyond it on the servers' disks), topk
and chunk_elems (dense).
"""

import ferry

OPTION_KEYS = frozenset(ferry.table_option_keys())
OPTIMIZERS = tuple(ferry.optimizers())
WIRES = ("f32", "fp16", "bf16")


def check_settings(where, optimizer, lr, consistency, wire, replicas_to_aggregate, options):
    """Refuses a bad setting before anything is declared, naming `where` (the table)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"{where}: optimizer '{optimizer}' is not one of {', '.join(OPTIMIZERS)}")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"{where}: lr must be a number > 0, not {lr!r}")
    if wire not in WIRES:
        raise ValueError(f"{where}: wire '{wire}' is not one of {', '.join(WIRES)}")
    if not (consistency in ("sync", "async") or (isinstance(consistency, str) and consistency.startswith("ssp:"))):
        raise ValueError(f"{where}: consistency '{consistency}' is not sync, async or ssp:S")
    if not (isinstance(replicas_to_aggregate, int) and replicas_to_aggregate >= 0):
        raise ValueError(f"{where}: replicas_to_aggregate must be an int >= 0, not {replicas_to_aggregate!r}")
    unknown = sorted(set(options) - OPTION_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(OPTION_KEYS))})")


def kind_of(consistency):
    """'sync', 'async' or 'ssp'."""
    return "ssp" if consistency.startswith("ssp:") else consistency


def declare(declare_fn, where, **kwargs):
    """Declares a table with the client's declare_sparse or declare_dense, adding `where` (the
    table) to a ferry.Error's text."""
    try:
        declare_fn(**kwargs)
    except ferry.Error as e:
        e.args = (f"{where}: {e}",) + e.args[1:]
        raise


class Steps:
    """Which step a group of tables' next pull asks for, and what its push is tagged with.

    Sync tables are read at the job's global step: a pull for step t is served once every server
    has closed t - 1, and says the step it was served at (ferry.Handle.version); the push that
    follows is tagged with that step and the next pull asks for it plus one (PROTOCOL.md, "Sync:
    the global step"): a worker that fell behind or joined late follows the job. Async tables
    ignore the step; ssp tables take it as this worker's clock.
    Thread-safety: not thread-safe; its module uses it under the GIL from one training loop."""

    def __init__(self, start):
        self.want = start     # the step the next pull asks for
        self.clock = start    # this worker's loop counter (the ssp clock)

    def pushed(self, tag):
        """After the push of a step tagged `tag`: the next pull asks for tag + 1."""
        self.want = tag + 1
        self.clock += 1
