"""The recompute executor: the plan's recompute decisions through PyTorch's own checkpointing.

Each checkpoint region (a module path from the schedule) has its forward run under
non-reentrant `torch.utils.checkpoint.checkpoint` (RNG state preserved) with a selective
checkpoint policy (`create_selective_checkpoint_contexts`). The policy names every aten
op by (innermost module, op name, occurrence in the forward pass), the same key the
schedule computed from the trace, and answers:

- planned for recompute -> PREFER_RECOMPUTE;
- saved by autograd and kept by the plan -> MUST_SAVE;
- random ops (seeded) -> MUST_SAVE, always: replaying them would draw a different RNG
  offset once earlier random ops come from the cache;
- views -> PREFER_RECOMPUTE (free, and caching one would pin its base);
- other ops the trace knows (outputs not saved) -> PREFER_RECOMPUTE; unknown ops -> MUST_SAVE.
Every answer gives the same numbers (a policy only trades memory against time), so a
step that differs from the trace still trains correctly.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import Counter

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from .schedule import RecomputeSpec

log = logging.getLogger(__name__)


class ModuleTracker:
    """The innermost module whose forward is running (by path), via global module hooks."""

    def __init__(self, model: torch.nn.Module):
        self._names = {id(m): name for name, m in model.named_modules()}
        self.stack: list[str] = []

    @contextlib.contextmanager
    def installed(self):
        """Track module calls while the block runs."""
        handles = [register_module_forward_pre_hook(self._pre), register_module_forward_hook(self._post)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            self.stack.clear()

    @property
    def current(self) -> str:
        """Path of the innermost running module ("" outside any)."""
        return self.stack[-1] if self.stack else ""

    def _pre(self, module, args):
        self.stack.append(self._names.get(id(module), self.current))

    def _post(self, module, args, output):
        if self.stack:
            self.stack.pop()


class RecomputeExecutor:
    """Wraps the forward of each planned region in selective non-reentrant checkpointing.

    Args:
        spec: regions and op keys from the schedule.
        model: the root module the trace's module paths refer to.
    """

    def __init__(self, spec: RecomputeSpec, model: torch.nn.Module):
        self.spec = spec
        self.model = model
        self.tracker = ModuleTracker(model)
        self.counts: Counter = Counter()
        self.recomputed_ops = 0  # ops answered PREFER_RECOMPUTE in forward, over all steps
        modules = dict(model.named_modules())
        self.regions = {path: modules[path] for path in spec.regions if path in modules}

    def begin_step(self) -> None:
        """Restart occurrence counting (call at the start of every iteration)."""
        self.counts.clear()

    @contextlib.contextmanager
    def installed(self):
        """Patch the regions' forwards for the duration of the block; restore them after."""
        saved = {}
        try:
            for path, module in self.regions.items():
                saved[path] = module.__dict__.get("forward")
                module.forward = self._wrap(module.forward)
            with self.tracker.installed():
                yield self
        finally:
            for path, module in self.regions.items():
                if path in saved:
                    if saved[path] is None:
                        module.__dict__.pop("forward", None)
                    else:
                        module.forward = saved[path]

    def _wrap(self, forward):
        @functools.wraps(forward)
        def checkpointed(*args, **kwargs):
            if not torch.is_grad_enabled():
                return forward(*args, **kwargs)
            return checkpoint(forward, *args, use_reentrant=False, context_fn=self._contexts,
                              preserve_rng_state=True, **kwargs)

        return checkpointed

    def _contexts(self):
        policy = _Policy(self)
        return create_selective_checkpoint_contexts(policy, allow_cache_entry_mutation=True)

    def decide(self, func) -> CheckpointPolicy:
        """The policy for the next forward call of `func` (advances its occurrence count)."""
        name = str(func)
        module = self.tracker.current
        key = (module, name, self.counts[(module, name)])
        self.counts[(module, name)] += 1
        if torch.Tag.nondeterministic_seeded in func.tags:
            return CheckpointPolicy.MUST_SAVE
        if key in self.spec.recompute_keys or getattr(func, "is_view", False):
            self.recomputed_ops += key in self.spec.recompute_keys
            return CheckpointPolicy.PREFER_RECOMPUTE
        if key in self.spec.save_keys:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.MUST_SAVE if not self._known(key) else CheckpointPolicy.PREFER_RECOMPUTE

    def _known(self, key) -> bool:
        return key in self.spec.known_keys


class _Policy:
    """One checkpoint call's policy: decides in forward, replays the same answers in recompute."""

    def __init__(self, owner: RecomputeExecutor):
        self.owner = owner
        self.answers: dict = {}
        self.replayed: Counter = Counter()

    def __call__(self, ctx, func, *args, **kwargs):
        if getattr(ctx, "is_recompute", False):  # older PyTorch asks again while recomputing
            i = self.replayed[func]
            self.replayed[func] += 1
            answers = self.answers.get(func, ())
            return answers[i] if i < len(answers) else CheckpointPolicy.PREFER_RECOMPUTE
        answer = self.owner.decide(func)
        self.answers.setdefault(func, []).append(answer)
        return answer
