"""PlanRuntime: everything that applies one plan to one model, installed and removed as a unit.

It owns the host slab (allocated once, sized from the plan), the copy engine, the swap
executor (saved-tensor hooks), the prefetch triggers (a gradient hook on the outputs of
each trigger module call: it fires when that call's backward starts), the storage swap
executor (parameters, gradients and optimizer state, at hook points, with a second host
slab of one fixed region per storage) and the recompute executor (checkpointed regions).
`installed()` adds every hook and patch and removes all of them on exit; `close()` brings
every swapped storage back and releases the slabs and the copy lanes.

Storages whose gap wraps around the iteration boundary stay on the host between two
steps. While they are away outside a step, calling the model, the optimizer's step,
`state_dict()` or `load_state_dict()` of either brings them back first; anything else
should call `restore()` before touching them.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from dataclasses import asdict

import torch
from torch.autograd.graph import register_multi_grad_hook, saved_tensors_hooks
from torch.utils._pytree import tree_leaves

from ..model import Plan, Trace
from .engine import CopyEngine, engine_for
from .events import EventHooks
from .recompute import RecomputeExecutor
from .schedule import build_schedule, region_modules
from .slab import HostSlab
from .storage_swap import StorageSwapExecutor
from .swap import SwapExecutor

log = logging.getLogger(__name__)


class PlanRuntime:
    """Applies `plan` (made for `trace`) to `model`.

    Args:
        trace: the traced iteration, with its pack record.
        plan: the plan.
        model: the root module the trace's module paths refer to (needed for recompute and
            for prefetch triggers; without it prefetches are issued at backward start).
        device: where the model's activations live (picks the copy engine).
        engine: a copy engine to use instead (tests pass a delayed one).
        optimizer: the model's optimizer (needed to swap optimizer state).
    """

    def __init__(self, trace: Trace, plan: Plan, model: torch.nn.Module | None = None, *,
                 device: torch.device | str = "cpu", engine: CopyEngine | None = None,
                 optimizer: torch.optim.Optimizer | None = None):
        self.model = model
        self.optimizer = optimizer
        self.modules = dict(model.named_modules()) if model is not None else {}
        self.schedule = build_schedule(trace, plan, modules=region_modules(model) if model is not None else None)
        for decision, reason in self.schedule.skipped:
            log.info("decision kept instead (%s): %s", reason, decision)
        self.device = torch.device(device)
        self.engine = engine or engine_for(self.device)
        self.slab = HostSlab(self.schedule.slab_bytes, pin=self.device.type == "cuda" and self.schedule.slab_bytes > 0,
                             on_recycle=lambda: self.engine.fence("d2h", "h2d"))
        self._storage_executor(trace)
        # Activations swapped at the storage level are found through their saved-tensor pack.
        watch = self.storage_swap.note_pack if self.schedule.storage and self.schedule.storage.watched else None
        self.swap = SwapExecutor(self.schedule, self.engine, self.slab, observer=watch) \
            if self.schedule.swaps or watch else None
        rec = self.schedule.recompute
        self.recompute = RecomputeExecutor(rec, model) if rec is not None and model is not None else None
        self._backward_calls: Counter = Counter()
        self._idle_guards: list = []
        self._closed = False

    def _storage_executor(self, trace: Trace) -> None:
        plan = self.schedule.storage
        pin = self.device.type == "cuda" and plan is not None and plan.slab_bytes > 0
        self.storage_slab = HostSlab(plan.slab_bytes if plan is not None else 0, pin=pin)
        self.storage_swap = self.events = None
        if plan is None:
            return
        self.storage_swap = StorageSwapExecutor(plan, self.engine, self.storage_slab, self.model, self.optimizer)
        self.events = EventHooks(self.model, plan.points, self.storage_swap.keys, self.storage_swap.fire,
                                 self.storage_swap.diverged, trace, before_op=self.storage_swap.before_op)

    # --- steps ----------------------------------------------------------------------------

    def begin_step(self) -> None:
        """Mark the start of one training iteration."""
        self._backward_calls.clear()
        if self.storage_swap is not None:
            self.events.begin_step()
            self.storage_swap.begin_step()
        if self.swap is not None:
            self.swap.begin_step()
        if self.recompute is not None:
            self.recompute.begin_step()

    @contextlib.contextmanager
    def installed(self, auto_steps: bool = False):
        """Install every hook for the block; remove them all on exit.

        Args:
            auto_steps: start a new iteration at each call of the root model's forward
                (for a training loop the user owns).
        """
        if self._closed:
            raise RuntimeError("this PlanRuntime was closed")
        handles = []
        self._drop_idle_guards()
        with contextlib.ExitStack() as stack:
            stack.callback(lambda: [h.remove() for h in handles])
            stack.callback(self._guard_idle)
            if auto_steps and self.model is not None:
                handles.append(self.model.register_forward_pre_hook(lambda m, a: self.begin_step()))
            if self.storage_swap is not None:
                stack.enter_context(self.events.installed())
            if self.swap is not None:
                handles += self._trigger_hooks()
                stack.enter_context(saved_tensors_hooks(self.swap.pack, self.swap.unpack))
            if self.recompute is not None:
                stack.enter_context(self.recompute.installed())
            yield self
            if self.swap is not None:
                self.swap.end_step()

    def _trigger_hooks(self) -> list:
        handles = []
        if self.model is not None:
            handles.append(self.model.register_forward_hook(self._on_forward("", start=True)))
        for path in sorted(self.schedule.trigger_modules):
            module = self.modules.get(path)
            if module is None:
                log.warning("trigger module %r not in the model: its prefetches are issued late", path)
                continue
            handles.append(module.register_forward_hook(self._on_forward(path)))
        return handles

    def _on_forward(self, path: str, start: bool = False):
        def hook(module, args, output):
            tensors = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
            if tensors and torch.is_grad_enabled():
                register_multi_grad_hook(tensors, lambda grad: self._on_backward(path, start), mode="any")

        return hook

    def _on_backward(self, path: str, start: bool) -> None:
        if start:
            self.swap.backward_started()
            return
        n = self._backward_calls[path]
        self._backward_calls[path] += 1
        self.swap.fire((path, n))

    # --- storages away between steps ---------------------------------------------------------

    def restore(self) -> None:
        """Bring back every parameter, gradient and optimizer state the plan keeps on the host."""
        if self.storage_swap is not None:
            self.storage_swap.restore()

    def _guard_idle(self) -> None:
        """Outside a step, using the model or optimizer first brings everything back."""
        if self.storage_swap is None or not self.storage_swap.away or self._idle_guards:
            return

        def bring_back(*args, **kwargs):
            self.restore()  # the handles go at the next step or at close: hooks may be iterated now

        owners = [o for o in (self.model, self.optimizer) if o is not None]
        self._idle_guards = [register(bring_back) for o in owners for register in (
            o.register_forward_pre_hook if isinstance(o, torch.nn.Module) else o.register_step_pre_hook,
            o.register_state_dict_pre_hook, o.register_load_state_dict_pre_hook)]

    def _drop_idle_guards(self) -> None:
        handles, self._idle_guards = self._idle_guards, []
        for handle in handles:
            handle.remove()

    # --- results ----------------------------------------------------------------------------

    def stats(self) -> dict:
        """Counters: swaps, prefetches, host memory, recomputation, skipped decisions."""
        out = {"slab_bytes": self.slab.nbytes, "slab_peak_bytes": self.slab.peak_bytes,
               "overflow_host_bytes": self.slab.overflow_bytes,
               "pinned_host_bytes": sum(s.nbytes for s in (self.slab, self.storage_slab) if s.pin),
               "swaps_planned": len(self.schedule.swaps),
               "recompute_regions": list(self.schedule.recompute.regions) if self.schedule.recompute else [],
               "recompute_storages": len(self.schedule.recompute.storages) if self.schedule.recompute else 0,
               "skipped_decisions": len(self.schedule.skipped),
               "skipped_reasons": dict(Counter(reason for _, reason in self.schedule.skipped))}
        if self.swap is not None:
            out.update(asdict(self.swap.stats))
        storage = self.schedule.storage
        out["storage_swaps_planned"] = len(storage.swaps) if storage is not None else 0
        out["storage_slab_bytes"] = self.storage_slab.nbytes
        if self.storage_swap is not None:
            out.update({f"storage_{k}": v for k, v in asdict(self.storage_swap.stats).items()})
        if self.recompute is not None:
            out["recomputed_ops"] = self.recompute.recomputed_ops
            out["policy_corrections"] = self.recompute.corrected
            out["policy_conflicts"] = self.recompute.conflicts
        return out

    def close(self) -> None:
        """Bring swapped storages back, wait for pending copies, then release the lanes and slabs."""
        if self._closed:
            return
        self._closed = True
        try:
            self.restore()
        finally:
            self._drop_idle_guards()
            self.engine.close()
            self.slab.buffer = torch.empty(0, dtype=torch.uint8)
            self.storage_slab.buffer = torch.empty(0, dtype=torch.uint8)
            if self.storage_swap is not None:
                self.storage_swap.close()  # its fixed regions are views of the slab
