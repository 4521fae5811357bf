"""Hook points: where the executor can act during a step, and where they lie in the trace.

The tracer records every hook point of the traced step (`meta["hook_events"]`): module
forward starts and ends, the start of each module call's backward, gradient
accumulation of each parameter, optimizer step starts and ends, each with the number of
ops recorded before it. A point is keyed by (kind, name, occurrence in the step), so the
k-th call of a module at run time is the k-th call of the trace. Inside an optimizer
step there is one more point between every two ops ("opt_op", keyed by trace position):
a dispatch mode counts the ops the tracer would record there and checks each one's name
against the trace.

`select_points` turns one gap of a storage into three points: the swap-out (the first
point after its last access), the prefetch (the latest point at or before the plan's
trigger, after the swap-out) and the wait (the last point before its next access).
`EventHooks` installs hooks at the points a schedule uses and calls `fire(key)`; when the
run leaves the traced order (a point fires before one it followed in the trace, or an
optimizer op differs from the trace's), it calls `diverged` once for the step.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
from dataclasses import dataclass
from typing import Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..model import Trace
from ..tracing.calls import CallNumbering, on_backward
from ..tracing.tracer import counts_as_op

log = logging.getLogger(__name__)

EventKey = tuple  # (kind, name, occurrence within the step)
MODULE_KINDS = ("fwd_pre", "fwd_post", "bwd")
OPT_OP = "opt_op"  # between two ops of an optimizer step; occurrence = trace position


@dataclass(frozen=True, kw_only=True)
class HookPoint:
    """One place in the step where the executor can run code."""

    key: tuple  # EventKey
    pos: int  # ops recorded before it in the trace


def hook_points(trace: Trace) -> tuple[HookPoint, ...]:
    """The trace's hook points in firing order, with one between every two optimizer-step ops.

    Returns:
        () for a trace without a hook-event record (made before it existed, or imported).
    """
    out: list[HookPoint] = []
    step_start = None
    for kind, name, n, pos in trace.meta.get("hook_events", ()):
        if kind == "pack":
            continue  # packs are not hooks the executor installs
        if kind == "opt_post" and step_start is not None:
            out += [HookPoint(key=(OPT_OP, "", k), pos=k) for k in range(step_start + 1, pos)]
            step_start = None
        out.append(HookPoint(key=(kind, name, int(n)), pos=int(pos)))
        if kind == "opt_pre":
            step_start = int(pos)
    return tuple(out)


def select_points(points: tuple[HookPoint, ...], n_ops: int, out_after: int, back_before: int, trigger: int,
                  out_ok: Callable[[HookPoint], bool] | None = None) -> tuple | None:
    """(swap-out, prefetch, wait) point keys for one gap, or None when no points fit in it.

    Times run on a two-iteration axis, so a wrap-around gap (back_before <= out_after)
    may go out in this iteration and come back in the next one's head. The swap-out is
    the first point after op `out_after` (that `out_ok` accepts), the wait the last
    point before op `back_before`, the prefetch the latest point at or before `trigger`
    that is after the swap-out (or the first after it). They must be three distinct
    moments in order, or the storage would come back as soon as it left.
    """
    m = len(points)
    if not m:
        return None
    upos = [p.pos for p in points] + [p.pos + n_ops for p in points]
    wraps = back_before <= out_after
    back = back_before + n_ops if wraps else back_before
    trig = trigger + n_ops if wraps and trigger <= out_after else trigger
    trig = min(max(trig, out_after + 1), back)
    p = bisect.bisect_left(upos, out_after + 1)
    while p < 2 * m and out_ok is not None and not out_ok(points[p % m]):
        p += 1
    w = bisect.bisect_right(upos, back) - 1
    q = max(bisect.bisect_right(upos, trig) - 1, p + 1)
    if not p < q <= w:
        return None
    return points[p % m].key, points[q % m].key, points[w % m].key


class EventHooks:
    """Hooks at the points whose keys are given; each calls `fire(key)` when reached.

    Args:
        model: the root module (module and parameter points need it).
        points: the trace's hook points (to check the run keeps the traced order).
        keys: the points to hook.
        fire: called with the key of each point reached, in order.
        diverged: called (with a reason) the first time in a step the run leaves the
            traced order; the step's later points are not fired.
        trace: the trace, whose optimizer-step ops the "opt_op" points are checked against.
        before_op: called with the tensors of every op inside an optimizer step, before
            it runs (the executor brings back anything away that an op touches).
    """

    def __init__(self, model: torch.nn.Module | None, points: tuple[HookPoint, ...], keys, fire: Callable,
                 diverged: Callable[[str], None], trace: Trace, before_op: Callable | None = None):
        self.model = model
        self.fire_cb = fire
        self.diverged_cb = diverged
        self.trace = trace
        self.before_op = before_op
        self._pos = {p.key: p.pos for p in points}
        self._steps = [(p.pos, q.pos) for p, q in _step_pairs(points)]
        keys = set(keys)
        self._kinds = {(k[0], k[1]) for k in keys}
        self._paths = sorted({name for kind, name in self._kinds if kind in MODULE_KINDS})
        self._params = sorted({name for kind, name in self._kinds if kind == "acc"})
        self._optimizer = any(kind in ("opt_pre", "opt_post", OPT_OP) for kind, _ in self._kinds)
        self._mode: _StepOps | None = None
        self.begin_step()

    # --- per step ---------------------------------------------------------------------------

    def begin_step(self) -> None:
        """Count occurrences from zero again."""
        self._calls = CallNumbering()
        self._last_pos = -1
        self._off = False

    def fire(self, key: tuple) -> None:
        """A point was reached: check the traced order, then hand it on."""
        if self._off:
            return
        pos = self._pos.get(key)
        if pos is None or pos < self._last_pos:
            self._off = True
            self.diverged_cb(f"hook point {key} {'is not in the trace' if pos is None else 'came out of order'}")
            return
        self._last_pos = pos
        self.fire_cb(key)

    # --- installation -------------------------------------------------------------------------

    @contextlib.contextmanager
    def installed(self):
        """Install the hooks for the block; remove them (and leave any optimizer mode) on exit."""
        handles = []
        try:
            handles += self._module_hooks() + self._param_hooks()
            if self._optimizer:
                handles += [register_optimizer_step_pre_hook(self._on_step_pre),
                            register_optimizer_step_post_hook(self._on_step_post)]
            yield self
        finally:
            for handle in handles:
                handle.remove()
            self._leave_step()

    def _module_hooks(self) -> list:
        modules = dict(self.model.named_modules()) if self.model is not None else {}
        handles = []
        for path in self._paths:
            module = modules.get(path)
            if module is None:
                log.warning("module %r of the plan is not in the model: its storage swaps are not run", path)
                continue
            handles.append(module.register_forward_pre_hook(self._on_pre(path)))
            handles.append(module.register_forward_hook(self._on_post(path)))
        return handles

    def _param_hooks(self) -> list:
        params = dict(self.model.named_parameters()) if self.model is not None else {}
        handles = []
        for name in self._params:
            if name in params and params[name].requires_grad:
                handles.append(params[name].register_post_accumulate_grad_hook(self._on_acc(name)))
        return handles

    def _on_pre(self, path: str):
        def hook(module, args):
            n = self._calls.enter(path)
            if ("fwd_pre", path) in self._kinds:
                self.fire(("fwd_pre", path, n))

        return hook

    def _on_post(self, path: str):
        def hook(module, args, output):
            n = self._calls.leave(path)
            if n is None:
                return
            if ("fwd_post", path) in self._kinds:
                self.fire(("fwd_post", path, n))
            if ("bwd", path) in self._kinds:
                on_backward(output, lambda: self.fire(("bwd", path, n)))

        return hook

    def _on_acc(self, name: str):
        return lambda param: self.fire(("acc", name, self._calls.next("acc", name)))

    # --- optimizer steps ------------------------------------------------------------------------

    def _on_step_pre(self, optimizer, args, kwargs) -> None:
        n = self._calls.next("opt_pre", "")
        self.fire(("opt_pre", "", n))
        if n < len(self._steps) and not self._off and self._mode is None:
            self._mode = _StepOps(self, *self._steps[n])
            self._mode.__enter__()

    def _on_step_post(self, optimizer, args, kwargs) -> None:
        self._leave_step()
        self.fire(("opt_post", "", self._calls.next("opt_post", "")))

    def _leave_step(self) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(None, None, None)
            if not self._off and mode.pos != mode.end:
                self._off = True
                self.diverged_cb(f"the optimizer step ran {mode.pos - mode.start} ops, the trace's "
                                 f"{mode.end - mode.start}")

    def op_done(self, func, pos: int, end: int) -> None:
        """The optimizer-step op at trace position `pos` ran (called by the step's dispatch mode).

        Args:
            func: the op.
            pos: its trace position.
            end: the trace position after the step's last op.
        """
        if self._off:
            return
        ops = self.trace.ops
        if pos >= end or ops[pos].name != str(func):
            self._off = True
            self.diverged_cb(f"optimizer op {pos} is {func}, the trace's {ops[pos].name if pos < end else '-'}")
            return
        if pos + 1 < end:  # the point after the last op is the step's end
            self.fire((OPT_OP, "", pos + 1))


class _StepOps(TorchDispatchMode):
    """Inside one optimizer step: counts the ops the tracer records and reports each one."""

    def __init__(self, hooks: EventHooks, start: int, end: int):
        super().__init__()
        self.hooks = hooks
        self.start = start  # trace position of the step's first op
        self.end = end  # trace position after its last op
        self.pos = start

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.hooks.before_op is not None:
            self.hooks.before_op([t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)])
        out = func(*args, **kwargs)
        if counts_as_op(func, args, kwargs, out):
            pos, self.pos = self.pos, self.pos + 1
            self.hooks.op_done(func, pos, self.end)
        return out


def _step_pairs(points: tuple[HookPoint, ...]) -> list[tuple[HookPoint, HookPoint]]:
    """(opt_pre, opt_post) points of each optimizer step, in order."""
    pre = [p for p in points if p.key[0] == "opt_pre"]
    post = [p for p in points if p.key[0] == "opt_post"]
    return list(zip(pre, post))
