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
The schedule gives every writer of one storage the same answer (see
`schedule.classify_ops`): a cached in-place op is replayed without mutating the recomputed
tensor, so mixed answers would feed later recomputed ops stale values. The policy enforces
the same rule at run time from the tensors themselves (an in-place op follows the op that
produced the storage it mutates), so a step whose keys drift from the trace stays correct.

Side effects on module buffers (batch-norm running statistics, `num_batches_tracked`)
would be applied twice when their ops run again; the recomputation runs with the
region's buffers snapshotted before and put back after it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import Counter

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._pytree import tree_leaves
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
        self.recomputed_ops = 0  # non-view ops answered PREFER_RECOMPUTE in forward, over all steps
        self.corrected = 0  # in-place ops whose planned answer disagreed with their producer's (fixed)
        self.conflicts = 0  # random in-place ops on recomputed tensors (cannot be fixed)
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
                module.forward = self._wrap(module.forward, module)
            with self.tracker.installed():
                yield self
        finally:
            for path, module in self.regions.items():
                if path in saved:
                    if saved[path] is None:
                        module.__dict__.pop("forward", None)
                    else:
                        module.forward = saved[path]

    def _wrap(self, forward, region: torch.nn.Module):
        contexts = functools.partial(self._contexts, region)

        @functools.wraps(forward)
        def checkpointed(*args, **kwargs):
            if not torch.is_grad_enabled():
                return forward(*args, **kwargs)
            return checkpoint(forward, *args, use_reentrant=False, context_fn=contexts,
                              preserve_rng_state=True, **kwargs)

        return checkpointed

    def _contexts(self, region: torch.nn.Module):
        policy = _Policy(self)
        forward_ctx, recompute_ctx = create_selective_checkpoint_contexts(policy, allow_cache_entry_mutation=True)
        return forward_ctx, _BuffersKept(recompute_ctx, region)

    def decide(self, func) -> CheckpointPolicy:
        """The planned answer for the next forward call of `func` (advances its occurrence count)."""
        name = str(func)
        module = self.tracker.current
        key = (module, name, self.counts[(module, name)])
        self.counts[(module, name)] += 1
        if torch.Tag.nondeterministic_seeded in func.tags:
            return CheckpointPolicy.MUST_SAVE
        if key in self.spec.recompute_keys or getattr(func, "is_view", False):
            return CheckpointPolicy.PREFER_RECOMPUTE
        if key in self.spec.save_keys or key not in self.spec.known_keys:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE


class _BuffersKept:
    """The recomputation context, with the region's buffers put back when it ends.

    Running the forward again would update batch-norm running statistics and counters a
    second time; restoring a snapshot taken when recomputation starts undoes exactly that
    (nothing else writes them while backward runs). Exiting early (checkpoint's early stop
    raises through this context) restores them too.
    """

    def __init__(self, inner, region: torch.nn.Module):
        self.inner = inner
        self.region = region
        self.saved: list = []

    def __enter__(self):
        with torch.no_grad():
            self.saved = [(b, b.clone()) for b in self.region.buffers() if b.numel()]
        return self.inner.__enter__()

    def __exit__(self, *exc):
        try:
            return self.inner.__exit__(*exc)
        finally:
            with torch.no_grad():
                for buffer, value in self.saved:
                    buffer.copy_(value)
            self.saved = []


class _Policy:
    """One checkpoint call's policy: decides in forward, replays the same answers in recompute.

    Where PyTorch shows the policy the op's output (`ctx.op_output`, PyTorch >= 2.12), it
    also keeps in-place updates consistent at run time: an op that mutates a storage
    produced earlier in this region gets that producer's answer (see the module docstring).
    """

    def __init__(self, owner: RecomputeExecutor):
        self.owner = owner
        self.answers: dict = {}
        self.replayed: Counter = Counter()
        self.by_storage: dict[int, CheckpointPolicy] = {}  # storage address -> its producer's answer

    def __call__(self, ctx, func, *args, **kwargs):
        if getattr(ctx, "is_recompute", False):  # older PyTorch asks again while recomputing
            i = self.replayed[func]
            self.replayed[func] += 1
            answers = self.answers.get(func, ())
            return answers[i] if i < len(answers) else CheckpointPolicy.PREFER_RECOMPUTE
        answer = self._consistent(func, self.owner.decide(func), args, kwargs, getattr(ctx, "op_output", None))
        if answer is CheckpointPolicy.PREFER_RECOMPUTE and not getattr(func, "is_view", False):
            self.owner.recomputed_ops += 1
        self.answers.setdefault(func, []).append(answer)
        return answer

    def _consistent(self, func, answer, args, kwargs, output) -> CheckpointPolicy:
        mutated = [_storage_key(t) for t in mutated_tensors(func, args, kwargs)]
        known = [self.by_storage[k] for k in mutated if k in self.by_storage]
        if known and known[0] is not answer:
            if torch.Tag.nondeterministic_seeded in func.tags:
                self.owner.conflicts += 1  # a random op is never replayed: keep it cached
                log.warning("random in-place op %s on a recomputed tensor: its region may recompute wrongly", func)
            else:
                self.owner.corrected += 1
                answer = known[0]
        if output is not None and not mutated and not getattr(func, "is_view", False):
            for t in tree_leaves(output):
                if isinstance(t, torch.Tensor) and (k := _storage_key(t)):
                    self.by_storage[k] = answer
        return answer


def mutated_tensors(func, args: tuple, kwargs: dict) -> list:
    """The tensors an aten op writes in place (its schema's `(a!)` arguments)."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        out += [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
    return out


def _storage_key(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensor subclasses without real storage
        return 0
