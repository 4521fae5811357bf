"""memplan.integrations.lightning: a LightningModule trained under a plan (issue 40).

A small LightningModule (an MLP with dropout, AdamW, a step scheduler, gradient clipping, a
`self.log` of its loss) trains for 20 steps with and without `MemplanCallback` from the same
seed, under a budget of 70% of the plain step's peak. Oracles: the plain run (its parameters
and the losses its logger received) and the plain step's peak, measured by memplan's memory
meter (independent of the planner and the executor) from the batch's start to its backward.
"""

from __future__ import annotations

import logging

import pytest
import torch

L = pytest.importorskip("lightning", reason="the lightning extra is not installed")

from lightning.pytorch.loggers import Logger  # noqa: E402
from lightning.pytorch.plugins import MixedPrecision  # noqa: E402

from memplan.errors import MemplanError  # noqa: E402
from memplan.exec.meter import MemoryMeter  # noqa: E402
from memplan.integrations.lightning import MemplanCallback  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 20
SHARE = 0.7
TOLERANCE = 0.02
WIDTH, BATCH = 128, 512


class MLP(L.LightningModule):
    def __init__(self):
        super().__init__()
        blocks = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU(), torch.nn.Dropout(0.1))
                  for _ in range(6)]
        self.net = torch.nn.Sequential(*blocks, torch.nn.Linear(WIDTH, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)}


class Recorder(Logger):
    """A logger that keeps what it is given."""

    name, version = "recorder", 0

    def __init__(self):
        super().__init__()
        self.metrics: list[tuple[int, dict]] = []

    @property
    def experiment(self):
        return None

    def log_metrics(self, metrics, step=None):
        self.metrics.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs):
        pass


class PlainPeaks(L.Callback):
    """Measures each plain step from the batch's start to its backward, as the callback plans it."""

    def __init__(self):
        self.peaks: list[int] = []
        self.meter = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx % trainer.accumulate_grad_batches == 0:
            trainer.optimizers[0].zero_grad(set_to_none=True)  # as MemplanCallback does: stale gradients go
        state = trainer.optimizers[0].state
        self.meter = MemoryMeter("cpu")
        self.meter.__enter__()
        self.meter.track((list(pl_module.parameters()), [p.grad for p in pl_module.parameters()],
                          [v for s in state.values() for v in s.values()], batch))
        self.meter.reset_peak()

    def on_after_backward(self, trainer, pl_module):
        self.meter.__exit__(None, None, None)
        self.peaks.append(self.meter.peak()["measured_peak_bytes"])


class BatchLosses(L.Callback):
    """The loss of every batch, as Lightning hands it to `on_train_batch_end`."""

    def __init__(self):
        self.losses: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"])


class UnloggedMLP(MLP):
    """The MLP without `self.log` in its training step: Dynamo cannot trace Lightning's log (torch 2.13,
    Lightning 2.6: it inspects the compiled `training_step`), compiled by Lightning or by memplan."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)


def train(tmp_path, callbacks=(), precision="32-true", accumulation=1, compile_backend=None):
    """Train a fresh MLP (seed 0) for STEPS optimizer steps (`compile_backend`: UnloggedMLP, compiled
    with it); returns the module and its logger."""
    L.seed_everything(0, verbose=False)
    module = UnloggedMLP() if compile_backend else MLP()
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(20 * BATCH, WIDTH, generator=g),
                                          torch.randint(0, 10, (20 * BATCH,), generator=g))
    logger, batch_losses = Recorder(), BatchLosses()
    # Lightning turns precision="16-mixed" into bf16 on the CPU; its plugin, given, runs fp16 with a grad scaler
    fp16 = dict(plugins=[MixedPrecision("16-mixed", "cpu")]) if precision == "16-mixed" else dict(precision=precision)
    trainer = L.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, **fp16,
                        accumulate_grad_batches=accumulation, gradient_clip_val=0.5,
                        callbacks=[*callbacks, batch_losses],
                        logger=logger, log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path))
    fitted = torch.compile(module, backend=compile_backend) if compile_backend else module
    trainer.fit(fitted, torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True))
    logger.batch_losses = batch_losses.losses
    logger.scaler = getattr(trainer.precision_plugin, "scaler", None)
    return module, logger


def losses(logger) -> list:
    return [(step, m["train_loss_step"]) for step, m in logger.metrics if "train_loss_step" in m]


@pytest.fixture(autouse=True)
def quiet_lightning():
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)


@pytest.mark.slow
@pytest.mark.parametrize("precision, accumulation, planner", [
    ("32-true", 1, "autoswap:doa"),
    ("32-true", 2, "capuchin"),  # the second batch of an accumulation adds to gradients
    ("bf16-mixed", 1, "capuchin"),
    ("16-mixed", 1, "autoswap:doa"),  # fp16 autocast with Lightning's grad scaler, on the CPU
])
def test_training_under_a_plan_is_plain_training_within_its_budget(tmp_path, precision, accumulation, planner):
    plain_peaks = PlainPeaks()
    plain, plain_log = train(tmp_path, [plain_peaks], precision, accumulation)
    budget = int(SHARE * max(plain_peaks.peaks))
    callback = MemplanCallback(budget, planner, measure=True, min_bytes=64 * 1024)
    planned, planned_log = train(tmp_path, [callback], precision, accumulation)
    assert (plain_log.scaler is not None) == (precision == "16-mixed")
    assert len(losses(plain_log)) == STEPS and len(plain_log.batch_losses) == STEPS * accumulation
    assert losses(planned_log) == losses(plain_log)  # the values Lightning logged, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(plain_log.batch_losses, planned_log.batch_losses))
    for (name, a), b in zip(plain.named_parameters(), planned.parameters()):
        assert torch.equal(a, b), name
    plans = callback.steps.stats()
    assert len(plans) == accumulation
    assert all(plan["decisions"] > 0 and plan["budget_bytes"] == budget for plan in plans)
    measured = [s["measured_peak_bytes"] for plan in plans for s in plan["steps_measured"]]
    assert len(measured) == STEPS * accumulation
    assert max(measured) <= budget * (1 + TOLERANCE)
    reports = [m for _, m in planned_log.metrics if "memplan/budget_bytes" in m]
    assert len(reports) == accumulation
    assert all(r["memplan/peak_bytes"] <= r["memplan/budget_bytes"] < r["memplan/unplanned_peak_bytes"]
               for r in reports)


@pytest.mark.slow
def test_a_compiled_module_trains_compiled_under_its_plans(tmp_path):
    # aot_eager: AOTAutograd and its partitioner without code generation (Inductor: tests/workflows/test_compiled.py)
    plain, plain_log = train(tmp_path, compile_backend="aot_eager")
    callback = MemplanCallback("80%", "auto", compile={"backend": "aot_eager"}, time_limit_s=2)
    planned, planned_log = train(tmp_path, [callback], compile_backend="aot_eager")
    assert len(plain_log.batch_losses) == STEPS
    assert all(torch.equal(a, b) for a, b in zip(plain_log.batch_losses, planned_log.batch_losses))
    for (name, a), b in zip(plain.named_parameters(), planned.parameters()):
        assert torch.equal(a, b), name
    plans = callback.steps.stats()
    assert len(plans) == 1 and plans[0]["executor"] == "compiled" and len(plans[0]["compilations"]) <= 2
    assert all(c["decisions_lowered"] > 0 for c in plans[0]["compilations"])


def test_strict_raises_at_the_first_batch_no_plan_meets(tmp_path):
    # neither autoswap:doa nor auto reaches 1 KiB: strict stops training there instead of running unplanned
    with pytest.raises(MemplanError, match="cannot be planned \\(strict\\)"):
        train(tmp_path, [MemplanCallback("1KiB", "autoswap:doa", strict=True)])
