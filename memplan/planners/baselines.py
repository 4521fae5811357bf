"""PyTorch-style baseline planners: what a PyTorch user already has.

- `none`: keep everything (plain training).
- `save-on-cpu`: `torch.autograd.graph.save_on_cpu`: every saved activation is copied to
  the host synchronously after its last forward use and fetched on demand when backward
  first needs it (no prefetch).
- `checkpoint-all`: `torch.utils.checkpoint` around every top-level block (first
  component of `Op.module`): inside a block every saved activation is dropped and
  recomputed, the block's outputs are kept; the block is re-run once, right before its
  first backward use.
- `sqrt-n`: Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost": the
  forward layers split into about sqrt(n) segments, segment outputs kept, the inside
  recomputed with the same mechanics. Where the trace records module calls, segments are cut
  only between the model's blocks (memplan.planners.kit.blocks), so each segment is a run of
  whole blocks that the executor recomputes natively, as torch.utils.checkpoint does; ops
  outside every block (embeddings, the head, the loss) are kept. Where whole blocks do not fit
  the budget (recomputing one holds all it saves), the layer segments are tried.

They ignore the budget for their decisions; each raises `infeasible(...)` when the peak
its plan reaches in the simulator with no cap (recompute chains' temporaries included)
exceeds the budget, naming that peak as the smallest feasible load.
"""

from __future__ import annotations

import bisect
import math

from ..errors import InfeasibleBudgetError
from ..model import Decision, Plan, Trace
from ..problem import Problem
from ..sim.simulate import simulator_of
from .base import infeasible, register
from .kit.blocks import block_calls
from .kit.replayable import replayable
from .kit.saved import SavedGap, last_access_before, saved_activations


@register("none", "keep everything resident (plain PyTorch training)", decides=())
def plan_none(problem: Problem) -> Plan:
    """Keep every storage; infeasible when the trace's own peak exceeds the budget."""
    return _finish(problem, (), "none")


@register("save-on-cpu", "torch.autograd.graph.save_on_cpu: every saved activation to host, fetched on demand",
          decides=("swap",))
def plan_save_on_cpu(problem: Problem) -> Plan:
    """Swap every saved activation synchronously after its last forward access.

    The fetch is issued when backward first needs it (trigger = back_before), as
    save_on_cpu's unpack hook does. The activations moved are those made in forward that
    backward reads (what autograd saved).
    """
    decisions = [Decision(storage=g.storage, action="swap", out_after=g.last_forward, back_before=g.back_before,
                          trigger=g.back_before, sync=True) for g in saved_activations(problem.trace)]
    return _finish(problem, decisions, "save-on-cpu")


@register("checkpoint-all", "torch.utils.checkpoint around every top-level block: recompute all but block outputs",
          decides=("recompute",))
def plan_checkpoint_all(problem: Problem) -> Plan:
    """Checkpoint every top-level module (the first component of `Op.module`).

    Forward ops outside any module (functional code in the model's own forward, the
    loss) are not checkpointed: what they produce is kept.
    """
    trace = problem.trace
    blocks = {op.index: op.module.split(".")[0] for op in trace.ops if op.phase == "forward" and op.module}
    return _finish(problem, checkpoint_decisions(trace, blocks), "checkpoint-all")


@register("sqrt-n", "Chen et al. 2016: ~sqrt(n) segments of forward layers, recompute inside segments",
          decides=("recompute",))
def plan_sqrt_n(problem: Problem, *, segments: int | None = None, by_blocks: bool = True) -> Plan:
    """Checkpoint ~sqrt(n) consecutive segments of the n forward layers.

    Args:
        segments: number of segments; default round(sqrt(n)).
        by_blocks: cut only between the model's blocks where the trace records them (each segment
            recomputed natively, as torch.utils.checkpoint does; Chen's layer segments when they do
            not fit the budget); False: Chen's layer segments, recomputed op by op.
    """
    trace = problem.trace
    if by_blocks and block_calls(trace):
        try:
            return _finish(problem, checkpoint_decisions(trace, sqrt_n_segments(trace, segments)), "sqrt-n")
        except InfeasibleBudgetError:
            pass  # recomputing a whole block holds all it saves: layer segments may fit
    layers = sqrt_n_segments(trace, segments, by_blocks=False)
    return _finish(problem, checkpoint_decisions(trace, layers), "sqrt-n")


# --- shared mechanics ---------------------------------------------------------------------------


def sqrt_n_segments(trace: Trace, segments: int | None = None, by_blocks: bool = True) -> dict[int, int]:
    """Map forward ops to their segment: forward layers (ops of one leaf module; single ops when
    the trace names no modules) cut into `segments` runs of equal length, or, where the trace
    records module calls, the model's blocks cut into runs of whole blocks (ops outside them in none).

    Args:
        trace: the trace.
        segments: number of segments; None for round(sqrt(number of layers)).
        by_blocks: cut between the model's blocks where the trace records them.
    Returns:
        {forward op index: segment number}.
    """
    forward = [op.index for op in trace.ops if op.phase == "forward"]
    starts = [layer.ops[0] for layer in trace.layers if layer.phase == "forward"] or forward
    if not starts:
        return {}
    count = max(1, min(len(starts), segments or round(math.sqrt(len(starts)))))
    blocks = block_calls(trace) if by_blocks else []
    if len(blocks) > 1:  # whole blocks per segment: about `count`, at most one a block
        per_block = math.ceil(len(blocks) / min(count, len(blocks)))
        return {i: k // per_block for k, b in enumerate(blocks) for i in range(b.first_op, b.end_op)}
    per_segment = math.ceil(len(starts) / count)
    # Ops before the first layer belong to the first; any other op to the layer it follows.
    return {i: max(0, bisect.bisect_right(starts, i) - 1) // per_segment for i in forward}


def checkpoint_decisions(trace: Trace, block_of: dict[int, object]) -> list[Decision]:
    """Recompute decisions that checkpoint every block of forward ops.

    A saved activation produced inside a block is recomputed unless a forward op of
    another block (or outside every block) reads it (a block output). All of a block's
    recomputed storages come back before the block's first backward access, so the block
    runs again once. One whose replay would need an input that is gone or overwritten by
    then is kept instead (`memplan.planners.kit.replayable`): a block boundary inside the block.

    Args:
        trace: the trace.
        block_of: {forward op index: block key}; forward ops missing from it are in no block.
    Returns:
        The recompute decisions.
    """
    members: dict[object, list[SavedGap]] = {}
    for g in saved_activations(trace):
        block = block_of.get(trace.producer(g.storage))
        if block is not None and trace.recomputable(g.storage) and not _read_outside(trace, g.storage, block, block_of):
            members.setdefault(block, []).append(g)
    decisions = []
    for gaps in members.values():
        back = min(g.back_before for g in gaps)
        for sid in (g.storage for g in gaps):
            out = last_access_before(trace, sid, back)
            if out + 1 < back:  # an empty gap would save nothing
                decisions.append(Decision(storage=sid, action="recompute", out_after=out, back_before=back))
    return replayable(trace, decisions)


def _read_outside(trace: Trace, sid: int, block: object, block_of: dict[int, object]) -> bool:
    """True when a forward op outside `block` reads `sid`: it is an output of the block."""
    return any(trace.ops[i].phase == "forward" and block_of.get(i) != block for i in trace.accesses[sid])


def _finish(problem: Problem, decisions, name: str) -> Plan:
    """The plan of `decisions`, refused (naming its peak) where it does not fit the problem's cap."""
    plan = Plan(decisions=tuple(decisions))
    peak = simulator_of(problem).run(plan).peak_load_bytes
    if peak > problem.budget_bytes:
        raise infeasible(problem.budget_bytes, peak, name)
    return plan
