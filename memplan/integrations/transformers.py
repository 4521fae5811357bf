"""The Hugging Face `Trainer`, training under a memplan plan: `MemplanTrainer`.

    trainer = MemplanTrainer(model=model, args=args, train_dataset=ds, memory_budget="6GiB", planner="auto")
    trainer.train()

Hugging Face's way to change how a step runs is to subclass `Trainer` and override
`training_step` ("Subclass and override to inject custom behavior"); `MemplanTrainer` does
that and nothing else: its `training_step` runs the Trainer's own (forward, loss, backward
through `accelerate`, so bf16 autocast and an fp16 grad scaler apply as usual) under the plan
of its step kind (memplan.integrations.planned), planned at the first batch of that kind: a
new padding length or the later micro-batches of gradient accumulation (which add to existing
gradients) are kinds of their own. Gradient accumulation, clipping, the optimizer and its
scheduler, and logging are the Trainer's, untouched. Each plan is reported in the Trainer's logs
(`state.log_history`, and every logging integration) after its first step, under keys starting
with "memplan/"; a kind that cannot be planned is logged with the reason and runs unplanned.

With `torch_compile=True` in the TrainingArguments the plan runs compiled (memplan.workflows.compiled,
docs/compile.md): memplan compiles the model's forward itself, with the plan lowered onto the
partitioner and the Trainer's `torch_compile_mode` (and backend, Inductor or aot_eager), instead of
the compiled model accelerate made.

On a GPU `memplan.optimize` traces fake copies of the model, so a step that does not fit
unplanned can still be planned. Needs `pip install memplan[hf]` (transformers, accelerate).
"""

from __future__ import annotations

import torch
from transformers import Trainer

from ..budget import UNLIMITED
from .planned import DEFAULT_MAX_PLANS, PlannedSteps

__all__ = ["MemplanTrainer"]


class MemplanTrainer(Trainer):
    """A `transformers.Trainer` whose every training step runs under a memplan plan.

    Args:
        *args: the Trainer's own arguments.
        memory_budget: the budget of every plan: bytes, "6GiB", or a share of the step's unplanned
            peak ("70%", 0.7); "none" (the default): no limit.
        planner: a registered planner name (`memplan planners` lists them).
        max_plans: step kinds (batch shapes, accumulation) planned at most; later ones run unplanned.
        strict: a step kind that would run unplanned (neither `planner` nor `auto` meets the budget, or
            max_plans) raises at its first batch instead.
        memplan_options: passed to `memplan.optimize`: run options (`"options": memplan.RunOptions(...)`, or
            its fields by name: `profile`, the cost model's device profile, `seed`, `measure`, `fake`), and
            the planner's parameters.
        **kwargs: the Trainer's own keyword arguments.
    """

    def __init__(self, *args, memory_budget=UNLIMITED, planner: str = "auto", max_plans: int = DEFAULT_MAX_PLANS,
                 strict: bool = False, memplan_options: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        options = dict(memplan_options or {})
        if self.args.torch_compile:
            options.setdefault("compile", _compile_settings(self.args))
        self.memplan = PlannedSteps(memory_budget, planner, max_plans=max_plans, strict=strict,
                                    report=lambda entry: self.log(dict(entry)), **options)

    def training_step(self, model: torch.nn.Module, inputs: dict, num_items_in_batch=None) -> torch.Tensor:
        """The Trainer's own training step, under the plan of its kind."""
        if self.args.torch_compile:
            model = getattr(model, "_orig_mod", model)  # memplan compiles the forward, under the plan

        def step(batch, num_items):
            return super(MemplanTrainer, self).training_step(model, batch, num_items)

        optimizer = getattr(self.optimizer, "optimizer", self.optimizer)  # accelerate wraps the torch optimizer
        return self.memplan.run(step, (inputs, num_items_in_batch), model, optimizer)

    def train(self, *args, **kwargs):
        """The Trainer's `train`; afterwards the plans' host memory is released (a later call plans again)."""
        try:
            return super().train(*args, **kwargs)
        finally:
            self.memplan.close()


def _compile_settings(args) -> dict:
    """torch.compile's keyword arguments as the TrainingArguments ask for them."""
    settings = {"mode": args.torch_compile_mode, "backend": args.torch_compile_backend}
    return {k: v for k, v in settings.items() if v is not None}
