"""Hypothesis strategies for random training iterations, consistent the way the tracer's are.

`training_traces()` draws one iteration of a random layered network: forward layers that
read the previous output, a weight (sometimes shared with another layer) and now and then
an older activation (a skip connection); a loss; backward ops in reverse that read what
their forward saved and write the input gradient and the weight's gradient (accumulated
in place for a shared weight); optimizer updates in place, with persistent state. Along
the way: in-place ops, view ops (which read the storage they alias and write nothing),
multi-output ops, short-lived temporaries and workspaces, persistent buffers written in
forward (running statistics), storages freed right after their last use or later (the
framework's free, or the end of the iteration), zero-size storages, zero-duration ops,
ops with and without module paths, and traces with no module at all (as imported logs).

The rules the tracer follows (README, "Traces and models") hold for every drawn trace, and
`consistency_errors` checks them independently of how the trace was built:
- a storage that did not exist before the step is born at its first access, a write;
  one that did (params, optimizer state, inputs) is born at op 0;
- its lifetime covers every access; params and optimizer state are persistent over [0, n),
  gradients live to the end of the iteration;
- an activation is made in forward and still alive when backward starts; everything else
  made in forward or backward is a temp (or a workspace, or a grad).

Use them in tests of any planner, e.g.::

    from hypothesis import given
    from memplan.testing.strategies import training_traces

    @given(training_traces())
    def test_mine(trace): ...
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

from ..model import KINDS, Op, Storage, Trace
from .lifetimes import access_spans, lifetime

KIB, MIB = 2**10, 2**20
# Sizes mix zero-size storages, small ones and ones above AutoSwap's 1 MiB candidate threshold.
SIZES = st.sampled_from((0, 64, 4 * KIB, 1 * MIB, 2 * MIB, 8 * MIB, 24 * MIB))
NONZERO_SIZES = st.sampled_from((64, 1 * MIB, 8 * MIB, 24 * MIB))
# Measured durations, none (the cost model decides) or zero (a view, an op the log timed at 0).
DURATIONS = st.one_of(st.none(), st.just(0.0), st.floats(1e-6, 1e-3))
FLOPS = st.sampled_from((0.0, 1e6, 1e9, 1e11))
TO_THE_END = -1  # a `late` value: the storage lives to the end of the iteration
# Ops after its last access a storage stays alive: most die right away, some later, some never.
LATE = st.sampled_from((0, 0, 0, 1, 3, TO_THE_END))
MODULE_MODES = ("all", "some", "none")  # every op in a module, a random share of them, none at all


def budget_shares() -> st.SearchStrategy[str]:
    """Budgets from 100% of the peak down to 10%, as strings ("37%"), the top ones more often."""
    return st.one_of(st.sampled_from((100, 99, 95, 90, 80)), st.integers(10, 100)).map(lambda share: f"{share}%")


@dataclass
class _Spec:
    """A storage being drawn; its lifetime and kind are derived from its accesses at the end."""

    nbytes: int
    role: str | None  # a fixed kind (param, grad, optimizer_state, input, workspace), else derived
    pre: bool = False  # exists before the step (born at op 0)
    late: int = 0  # ops it outlives its last access (TO_THE_END: to the end of the iteration)


@dataclass
class _Program:
    """Storages and ops drawn so far."""

    draw: object  # Hypothesis' draw function
    module_mode: str
    specs: list = field(default_factory=list)
    ops: list = field(default_factory=list)

    def storage(self, nbytes: int | None = None, role: str | None = None, pre: bool = False) -> int:
        size = self.draw(SIZES) if nbytes is None else nbytes
        late = 0 if pre and role != "input" or role == "workspace" else self.draw(LATE)
        self.specs.append(_Spec(nbytes=size, role=role, pre=pre, late=late))
        return len(self.specs) - 1

    def op(self, name: str, phase: str, module: str, reads=(), writes=(), *, view: bool = False) -> None:
        keep = self.module_mode == "all" or self.module_mode == "some" and self.draw(st.booleans())
        self.ops.append({"name": name, "phase": phase, "module": module if keep else "",
                         "reads": tuple(dict.fromkeys(reads)), "writes": tuple(dict.fromkeys(writes)),
                         "flops": 0.0 if view else self.draw(FLOPS), "view": view,
                         "duration_s": 0.0 if view else self.draw(DURATIONS)})


@dataclass
class _Layer:
    """What a forward layer leaves for its backward."""

    module: str
    weight: int | None  # its weight (possibly shared), if any
    saved: tuple  # storages its backward reads


@st.composite
def training_traces(draw, max_layers: int = 6, module_mode: str | None = None, backward: bool | None = None) -> Trace:
    """A random training iteration (see the module docstring).

    Args:
        draw: Hypothesis' draw (the strategy is called without it).
        max_layers: the most forward layers.
        module_mode: "all", "some" or "none" of the ops in a module; drawn when None.
        backward: whether there is a backward pass (and optimizer); drawn (mostly yes) when None.
    Returns:
        A strategy of Traces.
    """
    mode = draw(st.sampled_from(MODULE_MODES)) if module_mode is None else module_mode
    has_backward = draw(st.sampled_from((True, True, True, False))) if backward is None else backward
    p = _Program(draw=draw, module_mode=mode)
    layers, last = _forward(p, draw(st.integers(1, max_layers)))
    if has_backward:
        grads = _backward(p, layers, last)
        if grads and draw(st.booleans()):
            _optimizer(p, grads)
    return _build(p, meta={"source": "hypothesis", "module_mode": mode})


def _forward(p: _Program, n_layers: int) -> tuple[list[_Layer], int]:
    draw = p.draw
    h = p.storage(draw(NONZERO_SIZES), role="input", pre=True)  # a non-zero peak: shares of it are budgets
    acts, weights, layers = [h], [], []
    for i in range(n_layers):
        module = f"block{i // 2}.layer{i}" if draw(st.booleans()) else f"layer{i}"
        weight = _weight(p, weights)
        skip = [draw(st.sampled_from(acts))] if draw(st.booleans()) else []
        outs = [p.storage() for _ in range(draw(st.integers(1, 3)))]  # several outputs: saved statistics
        workspace, buffers = _forward_extras(p)
        p.op("aten.layer", "forward", module, [h, *skip, *([weight] if weight is not None else []), *buffers],
             outs + workspace + buffers)
        y = _after(p, module, outs[0])
        if draw(st.booleans()):  # an older activation updated in place after others read it
            older = draw(st.sampled_from(acts))
            p.op("aten.add_", "forward", module, [older, y], [older])
        saved = [s for s in (h, *skip, *outs) if draw(st.booleans())]
        layers.append(_Layer(module=module, weight=weight, saved=tuple(saved)))
        h = y
        acts.append(y)
    loss = p.storage(draw(NONZERO_SIZES))
    p.op("aten.loss", "forward", "loss", [h], [loss])
    return layers, loss


def _weight(p: _Program, weights: list[int]) -> int | None:
    """No weight, a new persistent one, or (weight tying) one an earlier layer has."""
    choice = p.draw(st.sampled_from(("none", "new", "new", "shared") if weights else ("none", "new")))
    if choice == "none":
        return None
    if choice == "shared":
        return p.draw(st.sampled_from(weights))
    weights.append(p.storage(role="param", pre=True))
    return weights[-1]


def _forward_extras(p: _Program) -> tuple[list[int], list[int]]:
    """([a workspace the layer's op writes and drops], [a persistent buffer it updates in place]), each
    maybe empty."""
    workspace = [p.storage(role="workspace")] if p.draw(st.booleans()) else []
    # Running statistics: read and written in forward, alive across iterations.
    buffers = [p.storage(role="param", pre=True)] if p.draw(st.booleans()) else []
    return workspace, buffers


def _after(p: _Program, module: str, y: int) -> int:
    """In-place ops, views and temporary chains after a layer's op; returns the layer's output."""
    draw = p.draw
    if draw(st.booleans()):
        p.op("aten.relu_", "forward", module, [y], [y])
    if draw(st.booleans()):
        p.op("aten.view", "forward", module, [y], view=True)
    if draw(st.booleans()):  # y -> t -> y2: t is a temporary that forward frees again
        t, y2 = p.storage(), p.storage()
        p.op("aten.mul", "forward", module, [y], [t])
        p.op("aten.add", "forward", module, [t], [y2])
        y = y2
    return y


def _backward(p: _Program, layers: list[_Layer], loss: int) -> dict[int, int]:
    """Backward ops in reverse layer order; returns {weight: its gradient}."""
    draw = p.draw
    g = p.storage()
    p.op("aten.loss_backward", "backward", "loss", [loss], [g])
    grads: dict[int, int] = {}
    for layer in reversed(layers):
        g_in = p.storage()
        reads, writes = [g, *layer.saved], [g_in]
        if layer.weight is not None:
            reads.append(layer.weight)
            if layer.weight in grads:  # a shared weight: its gradient is accumulated in place
                reads.append(grads[layer.weight])
            else:
                grads[layer.weight] = p.storage(p.specs[layer.weight].nbytes, role="grad")
            writes.append(grads[layer.weight])
        p.op("aten.layer_backward", "backward", layer.module, reads, writes)
        if draw(st.booleans()):
            p.op("aten.add_", "backward", layer.module, [g_in], [g_in])
        g = g_in
    return grads


def _optimizer(p: _Program, grads: dict[int, int]) -> None:
    """In-place updates of every weight, with persistent state and temporaries now and then."""
    for w, dw in grads.items():
        reads, writes = [w, dw], [w]
        if p.draw(st.booleans()):
            state = p.storage(p.specs[w].nbytes, role="optimizer_state", pre=True)
            p.op("aten.mul_", "optimizer", "", [state, dw], [state])
            reads.append(state)
        if p.draw(st.booleans()):
            t = p.storage(p.specs[w].nbytes)
            p.op("aten.mul", "optimizer", "", [dw], [t])
            reads.append(t)
        p.op("aten.add_", "optimizer", "", reads, writes)


# --- lifetimes and kinds --------------------------------------------------------------------------


def _build(p: _Program, meta: dict) -> Trace:
    n = len(p.ops)
    first_backward = next((i for i, op in enumerate(p.ops) if op["phase"] != "forward"), n)
    first, last = access_spans(p.ops)
    storages = []
    for sid, spec in enumerate(p.specs):
        persistent = spec.role in ("param", "optimizer_state")
        alloc, free = lifetime(first.get(sid), last.get(sid), n, pre=spec.pre, late=spec.late,
                               to_end=persistent or spec.role == "grad" or spec.late == TO_THE_END)
        kind = spec.role or _derived_kind(p.ops[alloc]["phase"], free, first_backward)
        storages.append(Storage(id=sid, nbytes=spec.nbytes, kind=kind, alloc_op=alloc, free_op=free,
                                persistent=persistent, dtype="float32", name=f"{kind}{sid}"))
    ops = tuple(Op(index=i, name=op["name"], phase=op["phase"], module=op["module"], reads=op["reads"],
                   writes=op["writes"], flops=op["flops"], duration_s=op["duration_s"],
                   bytes_accessed=0 if op["view"] else sum(p.specs[s].nbytes for s in set(op["reads"] + op["writes"])))
                for i, op in enumerate(p.ops))
    return Trace(storages=tuple(storages), ops=ops, meta=meta)


def _derived_kind(birth_phase: str, free_op: int, first_backward: int) -> str:
    """The tracer's rule: made in forward and alive when backward starts is an activation."""
    return "activation" if birth_phase == "forward" and free_op > first_backward else "temp"


# --- an independent check ---------------------------------------------------------------------------


def consistency_errors(trace: Trace) -> list[str]:
    """Every way `trace` breaks the tracer's rules (see the module docstring); [] when none.

    Written apart from the strategies, so it checks them (and any other trace source).
    """
    n, errors = len(trace.ops), []
    first_access: dict[int, tuple[int, bool]] = {}
    for op in trace.ops:
        for sid in (*op.reads, *op.writes):
            if not 0 <= sid < len(trace.storages):
                errors.append(f"op {op.index} names storage {sid}")
                continue
            s = trace.storages[sid]
            if not s.alloc_op <= op.index < s.free_op:
                errors.append(f"op {op.index} accesses storage {sid} outside [{s.alloc_op}, {s.free_op})")
            first_access.setdefault(sid, (op.index, sid in op.writes))
    for s in trace.storages:
        errors += _storage_errors(s, first_access.get(s.id), n)
    return errors


def _storage_errors(s: Storage, first: tuple[int, bool] | None, n: int) -> list[str]:
    out = []
    if s.kind not in KINDS:
        out.append(f"storage {s.id}: kind {s.kind!r}")
    if s.persistent and (s.alloc_op, s.free_op) != (0, n):
        out.append(f"storage {s.id} is persistent but lives over [{s.alloc_op}, {s.free_op})")
    if first is None:  # never accessed: a block a snapshot saw allocated, a minimalloc buffer
        return out
    op, written = first
    if s.alloc_op != 0 and (s.alloc_op != op or not written):
        out.append(f"storage {s.id} is born at op {s.alloc_op}, not at its first access (op {op}) by a write")
    return out
