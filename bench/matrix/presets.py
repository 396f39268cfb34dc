"""What a matrix runs: replication modes x worker counts x models, with budgets and targets.

Configuration is data: every preset is one Preset value below, and the command line of
ferry-matrix may narrow or override its fields (cli.py). build_runs() expands a preset into the
list of RunSpec, and RunSpec.trainer_args() is the one place that decides the flags every
ferry-trainer of a run gets.
"""

import dataclasses
import re

FASHION_MNIST_TRAIN = 60000  # examples in Fashion-MNIST's training set


# ---------------------------------------------------------------------------------------------
# Modes

@dataclasses.dataclass(frozen=True)
class Mode:
    """A replication mode as the matrix names it, and the trainer flags it stands for."""
    name: str              # "sync", "sync+backup1", "async", "ssp:2", "hybrid"
    consistency: str       # ferry-trainer --consistency: "sync" | "async" | "ssp:S"
    backup_workers: int = 0  # ferry-trainer --backup-workers (sync only)
    # The embedding tables' own consistency over `consistency` (ferry-trainer --table), for the
    # models that have embeddings: "hybrid" is PERSIA's, dense layers sync and embeddings async.
    embeddings: str = None

    @property
    def slug(self):
        """A file-name-safe form: 'sync+backup1' -> 'sync-backup1', 'ssp:2' -> 'ssp2'."""
        return self.name.replace("+", "-").replace(":", "")


_MODE_RE = re.compile(r"^(?:(sync)(?:\+backup(\d+))?|(async)|ssp:(\d+))$")


def parse_mode(text):
    """'sync' | 'sync+backupK' (K >= 1) | 'async' | 'ssp:S' (S >= 0) | 'hybrid' (dense sync,
    embeddings async) -> Mode; ValueError if not."""
    if text.strip() == "hybrid":
        return Mode("hybrid", "sync", embeddings="async")
    m = _MODE_RE.match(text.strip())
    if not m:
        raise ValueError(f"unknown mode '{text}' (want sync, sync+backupK, async, ssp:S or hybrid)")
    if m.group(1):
        k = int(m.group(2) or 0)
        if m.group(2) is not None and k < 1:
            raise ValueError(f"mode '{text}': the number of backup workers must be at least 1")
        return Mode(text.strip(), "sync", k)
    if m.group(3):
        return Mode("async", "async")
    return Mode(f"ssp:{int(m.group(4))}", f"ssp:{int(m.group(4))}")


# ---------------------------------------------------------------------------------------------
# Stragglers

_STRAGGLER_RE = re.compile(r"^(?:\d+(?:\.\d+)?ms|x\d+(?:\.\d+)?)$")


def parse_straggler(text):
    """'50ms' (sleep per step) or 'x2' (compute takes 2x) -> the same text; ValueError if not."""
    if not _STRAGGLER_RE.match(text):
        raise ValueError(f"--straggler '{text}': want a delay per step like 50ms, "
                         "or a slowdown factor like x2")
    if text.startswith("x") and float(text[1:]) < 1:
        raise ValueError(f"--straggler '{text}': a slowdown factor must be at least 1")
    return text


# ---------------------------------------------------------------------------------------------
# Models, presets

@dataclasses.dataclass
class ModelConfig:
    """One model of the matrix: its trainer flags, budget, evaluation schedule and target."""
    name: str                  # ferry-trainer --model
    title: str                 # for tables and plots
    args: list                 # model, data and optimizer flags (not budget, eval or report flags)
    batch: int                 # --batch, per worker
    train_examples: int        # training examples the trainer uses (to spread the evaluations)
    quality: str               # the metric that decides "reached": "accuracy" or "auc"
    target: float              # time to target = first evaluation with quality >= target
    epochs: int = None         # budget: exactly one of epochs and steps (per worker)
    steps: int = None
    evals: int = 10            # evaluations spread evenly over a run (plus the one at the end)
    test_limit: int = None     # --test-limit (None: the whole test set)
    loss_name: str = "loss"    # the eval field with the test loss ("log_loss" for ctr)
    embeddings: str = None     # the trainer's name pattern of its embedding tables, if it has any

    def budget_text(self):
        return f"{self.epochs} epoch(s)" if self.epochs else f"{self.steps} steps per worker"


@dataclasses.dataclass
class Preset:
    name: str
    description: str
    workers: list              # worker counts
    modes: list                # mode names; "ssp:{ssp}" stands for the bound of --ssp
    ssp: int                   # the default of --ssp
    models: dict               # name -> ModelConfig
    num_ps: int = 2
    run_timeout_s: float = 180.0  # one run, launcher start to exit
    expected: str = ""         # how long the whole preset takes, measured where it says so


def _mlp(**kw):
    hidden = kw.pop("hidden", "256,128")
    base = dict(name="mlp", title="Fashion-MNIST MLP",
                args=["--model", "mlp", "--hidden", hidden, "--optimizer", "adam",
                      "--lr", "0.001"],
                batch=64, train_examples=FASHION_MNIST_TRAIN, quality="accuracy",
                loss_name="loss")
    base.update(kw)
    return ModelConfig(**base)


def _ctr(train, test, **kw):
    base = dict(name="ctr", title="synthetic CTR",
                args=["--model", "ctr", "--hidden", "64,32", "--emb-dim", "16",
                      "--ctr-train", str(train), "--ctr-test", str(test), "--optimizer", "adam",
                      "--lr", "0.003"],
                batch=256, train_examples=train, quality="auc", loss_name="log_loss",
                embeddings="ctr/emb*")
    base.update(kw)
    return ModelConfig(**base)


ALL_MODES = ["sync", "sync+backup1", "async", "ssp:2", "ssp:{ssp}", "hybrid"]

PRESETS = {
    "tiny": Preset(
        name="tiny",
        description="a few steps per run, for the harness's own test; the numbers mean nothing",
        workers=[1, 2], modes=["sync", "sync+backup1", "async", "ssp:{ssp}", "hybrid"], ssp=1,
        models={"mlp": _mlp(hidden="32", steps=6, evals=2, test_limit=200, target=0.3),
                "ctr": _ctr(2048, 512, steps=6, evals=2, target=0.5)},
        run_timeout_s=60.0,
        expected="about 20 s on 2 cores"),
    "small": Preset(
        name="small",
        description="every mode x 1, 2, 4 workers x both models; mlp 4 epochs (5,000 test "
                    "examples), ctr 1 epoch of 1M examples",
        workers=[1, 2, 4], modes=list(ALL_MODES), ssp=8,
        models={"mlp": _mlp(epochs=4, evals=12, test_limit=5000, target=0.86),
                "ctr": _ctr(1000000, 10000, epochs=1, evals=12, target=0.81)},
        run_timeout_s=180.0,
        expected="3.5 minutes on 2 cores (measured before the hybrid mode was added, whose "
                 "three ctr runs it does not include), 4 with --straggler x2, 8 with "
                 "--straggler 10ms"),
    "full": Preset(
        name="full",
        description="every mode x 1, 2, 4 workers x both models; mlp 10 epochs (whole test "
                    "set), ctr 2 epochs of 1M examples",
        workers=[1, 2, 4], modes=list(ALL_MODES), ssp=8,
        models={"mlp": _mlp(epochs=10, evals=20, test_limit=None, target=0.88),
                "ctr": _ctr(1000000, 20000, epochs=2, evals=20, target=0.81)},
        run_timeout_s=900.0,
        expected="7 minutes on 2 cores (measured before the hybrid mode was added; "
                 "bench/results/HISTORY.md)"),
}


# ---------------------------------------------------------------------------------------------
# Runs

@dataclasses.dataclass
class RunSpec:
    """One cell of the matrix: a model, a worker count and a mode, with everything it needs."""
    model: ModelConfig
    workers: int
    mode: Mode
    num_ps: int
    seed: int
    straggler: str = None      # trainer --straggler value ("1:x2"), None without one
    extra_args: list = dataclasses.field(default_factory=list)  # --trainer-arg, verbatim

    @property
    def run_id(self):
        return f"{self.model.name}-w{self.workers}-{self.mode.slug}"

    def steps_estimate(self):
        """Steps per worker: exact for a steps budget; for an epochs one, ceil(smallest shard /
        batch) per epoch, as ferry-trainer counts them (trainer.h)."""
        if self.model.steps:
            return self.model.steps
        per_worker = self.model.train_examples // self.workers
        return max(1, self.model.epochs * -(-per_worker // self.model.batch))

    def eval_every(self):
        return max(1, self.steps_estimate() // max(1, self.model.evals))

    def log_every(self):
        return max(1, self.steps_estimate() // 20)

    def trainer_args(self, metrics_pattern):
        """Flags for every ferry-trainer of this run; metrics_pattern holds '{rank}'."""
        m = self.model
        args = list(m.args) + ["--batch", str(m.batch), "--seed", str(self.seed)]
        args += ["--epochs", str(m.epochs)] if m.epochs else ["--steps", str(m.steps)]
        args += ["--consistency", self.mode.consistency]
        if self.mode.backup_workers:
            args += ["--backup-workers", str(self.mode.backup_workers)]
        if self.mode.embeddings:
            args += ["--table", f"{m.embeddings}:consistency={self.mode.embeddings}"]
        args += ["--eval-every", str(self.eval_every()), "--log-every", str(self.log_every())]
        if m.test_limit:
            args += ["--test-limit", str(m.test_limit)]
        if self.straggler:
            args += ["--straggler", self.straggler]
        args += ["--metrics-out", metrics_pattern, "--quiet"]
        return args + list(self.extra_args)

    def describe(self):
        """The run's settings as plain data (for runs.json)."""
        return {"run_id": self.run_id, "model": self.model.name, "workers": self.workers,
                "mode": self.mode.name, "consistency": self.mode.consistency,
                "backup_workers": self.mode.backup_workers, "embeddings": self.mode.embeddings,
                "num_ps": self.num_ps,
                "seed": self.seed, "straggler": self.straggler,
                "batch": self.model.batch, "budget": self.model.budget_text(),
                "quality_metric": self.model.quality, "target": self.model.target}


def expand_modes(names, ssp):
    """Mode names (with 'ssp:{ssp}') -> list of Mode, duplicates dropped, order kept."""
    out, seen = [], set()
    for n in names:
        mode = parse_mode(n.replace("{ssp}", str(ssp)))
        if mode.name not in seen:
            seen.add(mode.name)
            out.append(mode)
    return out


# ferry-trainer flags a run's settings decide (RunSpec.trainer_args); --trainer-arg may not
# repeat them. --accumulate and --train-limit are refused too: they change the steps a run takes,
# which the evaluation schedule is derived from.
HARNESS_OWNED_FLAGS = ("--model", "--batch", "--seed", "--epochs", "--steps", "--consistency",
                       "--backup-workers", "--eval-every", "--log-every", "--test-limit",
                       "--straggler", "--metrics-out", "--quiet", "--servers", "--rank",
                       "--num-workers", "--local", "--accumulate", "--train-limit", "--table")


def check_extra_args(extra_args):
    """ValueError naming the first --trainer-arg flag the harness sets itself."""
    for arg in extra_args:
        if arg.split("=", 1)[0] in HARNESS_OWNED_FLAGS:
            raise ValueError(f"--trainer-arg {arg}: the harness sets {arg.split('=', 1)[0]} "
                             "itself (change it with the harness's own flags, or the preset)")


def build_runs(models, workers, modes, num_ps, seed, straggler=None, extra_args=()):
    """The matrix, models outermost, then worker counts, then modes.

    Returns (runs, skipped): a mode needing more workers than a cell has (sync+backupK with
    K >= workers), or embeddings a model has not (hybrid for mlp), is not run and is listed in
    `skipped` as (model, workers, mode, why)."""
    runs, skipped = [], []
    for m in models:
        for w in workers:
            for mode in modes:
                if mode.backup_workers >= w:
                    skipped.append((m.name, w, mode.name,
                                    f"needs more than {mode.backup_workers} worker(s)"))
                    continue
                if mode.embeddings and not m.embeddings:
                    skipped.append((m.name, w, mode.name, "the model has no embedding tables"))
                    continue
                strag = f"{w - 1}:{straggler}" if straggler and w > 1 else None
                runs.append(RunSpec(m, w, mode, num_ps, seed, strag, list(extra_args)))
    return runs, skipped
