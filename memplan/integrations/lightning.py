"""PyTorch Lightning, training under a memplan plan: `MemplanCallback`.

    trainer = lightning.Trainer(callbacks=[MemplanCallback(memory_budget="6GiB", planner="auto")], ...)
    trainer.fit(module, loader)

Lightning's extension point for work around each batch that leaves the module's code alone is
a callback. In automatic optimization Lightning runs each batch as a closure: `training_step`,
`optimizer_zero_grad` (at the first batch of an accumulation), then `backward`; the optimizer
step, gradient clipping and the scheduler follow. The callback runs that closure under the plan
of its step kind (memplan.integrations.planned): the step begins at `on_train_batch_start` and
ends at `on_after_backward`, so precision plugins (bf16 autocast, the fp16 grad scaler),
accumulation, clipping, the optimizer and the scheduler stay Lightning's own. To trace a new
kind, a stand-in of the closure made of the same public pieces (`Strategy.training_step`,
`LightningModule.optimizer_zero_grad`, `Strategy.backward`) runs; the module's `self.log`
calls are muted while it does, so logged values are those of the real steps only. Each plan's
report (keys starting with "memplan/") goes to the Trainer's loggers after its first step.

A compiled LightningModule (`trainer.fit(torch.compile(module))`) is trained under compiled plans
(memplan.workflows.compiled, docs/compile.md): the callback takes the compilation over, as
Lightning's `to_uncompiled` undoes it, and compiles the module's `training_step` (what Lightning
compiles) with each plan lowered onto the partitioner; `compile={...}` gives torch.compile's
settings (Inductor's defaults otherwise), and `compile=True` compiles a module that was not.

Manual optimization (`automatic_optimization = False`) is not planned (a warning says so):
there the module's own code runs forward, backward and the optimizer in one `training_step`.
Needs `pip install memplan[lightning]`.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from numbers import Number

from lightning.pytorch import Callback
from lightning.pytorch.loops.optimization.automatic import ClosureResult
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.compile import to_uncompiled

from ..budget import UNLIMITED
from .planned import DEFAULT_MAX_PLANS, PlannedSteps, kind_of

__all__ = ["MemplanCallback"]

log = logging.getLogger(__name__)


class MemplanCallback(Callback):
    """A Lightning callback that runs every training batch's forward and backward under a plan.

    Args:
        memory_budget: the budget of every plan: bytes, "6GiB", or a share of the step's unplanned
            peak ("70%", 0.7); "none" (the default): no limit.
        planner: a registered planner name (`memplan planners` lists them).
        max_plans: step kinds (batch shapes, accumulation) planned at most; later ones run unplanned.
        strict: a step kind that would run unplanned (neither `planner` nor `auto` meets the budget, or
            max_plans) raises at its first batch instead.
        **options: passed to `memplan.optimize`: run options (`options=memplan.RunOptions(...)`, or its
            fields by name: `profile`, the cost model's device profile, `seed`, `measure` ("first", True or
            False), `fake`, `compile`: True, or torch.compile's settings: the plans run compiled), and the
            planner's parameters.
    """

    def __init__(self, memory_budget=UNLIMITED, planner: str = "auto", max_plans: int = DEFAULT_MAX_PLANS,
                 strict: bool = False, **options):
        self.steps = PlannedSteps(memory_budget, planner, max_plans=max_plans, strict=strict, report=self._report,
                                  **options)
        self._trainer = None
        self._warned_manual = False

    @property
    def reports(self) -> list[dict]:
        """Every plan's report (and every reason a step kind ran unplanned), in order."""
        return self.steps.reports

    def on_fit_start(self, trainer, pl_module) -> None:
        """A compiled module: memplan compiles its training_step under each plan instead."""
        compile = self.steps.options.compile  # None: eager
        if getattr(pl_module, "_compiler_ctx", None) is not None:
            to_uncompiled(pl_module)
            compile = compile or {}
            rank_zero_info("memplan: the LightningModule is compiled under each plan (its training_step, as "
                           "Lightning compiles it)")
        if compile is not None:
            self.steps.options = replace(self.steps.options, compile={**compile, "method": "training_step"})

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        """Begin the batch's step under the plan of its kind (planned now if the kind is new)."""
        if not pl_module.automatic_optimization:
            if not self._warned_manual:
                log.warning("memplan: manual optimization is not planned: its training_step runs unplanned")
                self._warned_manual = True
            return
        self._trainer = trainer
        optimizer = trainer.optimizers[0]
        zeroes = batch_idx % trainer.accumulate_grad_batches == 0  # as Lightning's closure decides
        if zeroes:  # now rather than after the forward: the memory of stale gradients, and a step kind less
            optimizer.zero_grad(set_to_none=True)
        step = _stand_in(trainer, pl_module, batch_idx, zeroes)
        self.steps.begin(kind_of((batch,), pl_module), step, (batch,), pl_module, optimizer)

    def on_after_backward(self, trainer, pl_module) -> None:
        """End the step: the optimizer step, clipping and the scheduler follow, unplanned."""
        self.steps.end()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        """End a step whose backward was skipped (`training_step` returned None)."""
        self.steps.end()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        """Leave the step the exception ended, and bring everything back."""
        self.steps.end(exception)
        self.steps.close()

    def on_train_end(self, trainer, pl_module) -> None:
        """Release the plans' host memory (a later `fit` plans again)."""
        self.steps.close()

    def _report(self, entry: dict) -> None:
        """A plan's report: its numbers to the Trainer's loggers, all of it to the console."""
        rank_zero_info("memplan: " + ", ".join(f"{k.removeprefix('memplan/')}={v}" for k, v in entry.items()))
        numbers = {k: float(v) for k, v in entry.items() if isinstance(v, Number)}
        trainer = self._trainer
        if trainer is None or not numbers:
            return
        for logger in trainer.loggers:
            logger.log_metrics(numbers, step=trainer.global_step)


def _stand_in(trainer, pl_module, batch_idx: int, zeroes: bool):
    """What Lightning's closure does for one batch, made of its public pieces: traced for a new kind."""
    optimizer = trainer.optimizers[0]

    def step(batch):
        with _muted(pl_module):
            out = trainer.strategy.training_step(batch, batch_idx)
            result = ClosureResult.from_training_step_output(out, trainer.accumulate_grad_batches)
            if zeroes:
                pl_module.optimizer_zero_grad(trainer.current_epoch, batch_idx, optimizer)
            trainer.strategy.backward(result.closure_loss, optimizer)
        return result.loss

    return step


@contextlib.contextmanager
def _muted(pl_module):
    """The module's `log` and `log_dict` do nothing in the block (tracing runs the step twice)."""
    def nothing(*args, **kwargs):
        return None

    pl_module.log = pl_module.log_dict = nothing
    try:
        yield
    finally:
        del pl_module.log, pl_module.log_dict
