"""An optimizer's step run a stretch of parameters at a time, with a hook before each stretch.

PyTorch calls no Python while an optimizer updates its parameters: its step pre- and post-hooks
fire once, around all of them. torch.optim's per-parameter optimizers in their single-tensor form
(`foreach` and `fused` off, as torch picks on the CPU) update each parameter alone, one after the
other, in param-group order, and nothing in one parameter's update reads another's. So their step
run over consecutive stretches of the parameters does the same ops in the same order as one call,
bit for bit, and the points between stretches are hooks: `Stepwise` narrows each param group to
the first stretch in a step pre-hook (the last one), runs the other stretches at the start of the
step's post-hooks (the first one, before every other post-hook sees the step), and calls
`on_update(param)` before each stretch. The hooked executor splits the step only where its program
acts (memplan.exec.hooked). A step given a closure (it may run forward and backward again) runs
whole.

The tracer records the step whole, as plain training runs it, and finds where each update begins
from its ops (`update_marks`): the first op that touches one of the parameter's storages (itself,
its gradient, its state). A split step frees an update's temporaries when its stretch returns, not
when the loop's next iteration overwrites them: never later than the trace has them.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.optim.optimizer import _default_to_fused_or_foreach

from ..errors import MemplanError
from ..model import Mark, Op, Owner

# Optimizers whose single-tensor step updates each parameter from its own gradient and state alone.
PER_PARAMETER = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax, torch.optim.NAdam,
                 torch.optim.RAdam, torch.optim.RMSprop, torch.optim.Adagrad, torch.optim.Adadelta,
                 torch.optim.Rprop, torch.optim.ASGD)


def steps_by_parameter(optimizer) -> bool:
    """Whether `optimizer`'s step updates its parameters one at a time (see the module docstring):
    a torch.optim per-parameter optimizer whose every group runs the single-tensor loop."""
    if type(optimizer) not in PER_PARAMETER:
        return False
    for group in optimizer.param_groups:
        if group.get("fused") or group.get("differentiable"):
            return False
        foreach = group.get("foreach")
        if foreach is None:
            foreach = _default_to_fused_or_foreach(group["params"], differentiable=False, use_fused=False)[1]
        if foreach:
            return False
    return True


def split_step(optimizer, model, names: list[str], on_update: Callable[[str], None]) -> Stepwise:
    """`optimizer`'s step split where the parameters of `model` named `names` begin their updates,
    with `on_update(name)` there.

    Raises:
        MemplanError: the optimizer does not step by parameter (or there is no model or optimizer).
    """
    if model is None or optimizer is None or not steps_by_parameter(optimizer):
        raise MemplanError(f"the plan acts inside the optimizer's step, before parameter {names[0]!r} is updated, "
                           f"but {type(optimizer).__name__} does not update its parameters one at a time here (a "
                           "per-parameter torch.optim optimizer with foreach and fused off does): trace and plan the "
                           "step with the model and optimizer it trains")
    by_id = {id(model.get_parameter(name)): name for name in names}
    return Stepwise(optimizer, lambda p: on_update(by_id[id(p)]), split_at=lambda p: id(p) in by_id)


class Stretch(list):
    """A param group's parameters narrowed to a stretch while the step runs it; `whole` is the group's list."""

    def __init__(self, params: list, whole: list):
        super().__init__(params)
        self.whole = whole


def group_params(group: dict) -> list:
    """A param group's parameters, all of them even while a step runs a stretch of them."""
    params = group["params"]
    return params.whole if isinstance(params, Stretch) else params


class Stepwise:
    """While installed, `optimizer`'s step runs in stretches, a new one at each parameter `split_at`
    accepts (None: every parameter), with `on_update(param)` called before each of those.

    Install it with `install()` and take it off with `remove()` (a handle, like a hook's)."""

    def __init__(self, optimizer, on_update: Callable[[torch.nn.Parameter], None],
                 split_at: Callable[[torch.nn.Parameter], bool] | None = None):
        self.optimizer = optimizer
        self.on_update = on_update
        self.split_at = split_at
        self._step = type(optimizer).step.__wrapped__  # the step itself, without torch's hooks around it
        self._full: list[list] | None = None  # the groups' parameter lists while a step is narrowed
        self._rest: list[list[list]] = []  # the stretches left to run, each as every group's list
        self._handles = []

    def install(self) -> "Stepwise":
        self._handles = [self.optimizer.register_step_pre_hook(self._narrow),
                         self.optimizer.register_step_post_hook(self._finish)]
        # first of the post-hooks (torch has no `prepend` for them): every other one sees the whole step
        self.optimizer._optimizer_step_post_hooks.move_to_end(self._handles[1].id, last=False)
        return self

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.restore()

    def restore(self) -> None:
        """Put every group's parameters back (a step that raised leaves them narrowed)."""
        if self._full is not None:
            for group, params in zip(self.optimizer.param_groups, self._full):
                group["params"] = params
            self._full, self._rest = None, []

    def _stretches(self) -> list[list[list]]:
        """The step's stretches, each as every group's parameters in it, in the order they update."""
        groups = self.optimizer.param_groups
        out: list[list[list]] = []
        for g, group in enumerate(groups):
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not out or self.split_at is None or self.split_at(p):
                    out.append([[] for _ in groups])
                out[-1][g].append(p)
        return out

    def _narrow(self, optimizer, args, kwargs) -> None:
        self.restore()
        if len(args) > 1 or kwargs.get("closure") is not None:
            return  # a closure may run forward and backward: the step runs whole
        stretches = self._stretches()
        if not stretches:
            return
        self._full = [group["params"] for group in optimizer.param_groups]
        self._rest = stretches[1:]
        self._enter(stretches[0])

    def _finish(self, optimizer, args, kwargs) -> None:
        if self._full is None:
            return
        try:
            for stretch in self._rest:
                self._enter(stretch)
                self._step(optimizer)
        finally:
            self.restore()

    def _enter(self, stretch: list[list]) -> None:
        """Narrow every group to its parameters in `stretch`, then call the hook where it begins at a split."""
        for group, params, whole in zip(self.optimizer.param_groups, stretch, self._full):
            group["params"] = Stretch(params, whole)
        first = next(p for params in stretch for p in params)
        if self.split_at is None or self.split_at(first):
            self.on_update(first)


def update_marks(ops: tuple[Op, ...], owners: tuple[Owner, ...], marks: list[Mark], model, optimizer) -> list[Mark]:
    """Where each parameter's update begins in the traced step of `optimizer` (see the module docstring),
    as `update` marks: none unless it steps by parameter, the iteration stepped it once, and its ops
    touch the parameters' storages one parameter after another, in its order, never two at once."""
    steps = [m.point for m in marks if m.kind in ("step", "stepped")]
    if model is None or optimizer is None or len(steps) != 2 or not steps_by_parameter(optimizer):
        return []
    names = {id(p): name for name, p in model.named_parameters()}
    order, place = [], {}
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            place[g, i] = names.get(id(p))
            if p.grad is not None:
                order.append(names.get(id(p)))
    owned = {o.storage: o.name if o.kind in ("param", "grad") else place.get((o.group, o.index))
             for o in owners if o.kind in ("param", "grad", "state")}
    begins: list[tuple[str, int]] = []
    for op in ops[steps[0]:steps[1]]:
        touched = {owned[s] for s in (*op.reads, *op.writes) if s in owned}
        if len(touched) > 1 or None in touched:
            return []
        if touched and (not begins or begins[-1][0] not in touched):
            begins.append((touched.pop(), op.index))
    if [name for name, _ in begins] != order:
        return []
    return [Mark(kind="update", key=name, occurrence=0, point=point) for name, point in begins]
