"""What recomputing a storage replays: its producer chain, rebuilding missing inputs first.

A recompute decision rebuilds storage `s` right before op `before` by running again the
ops that wrote it (`Trace.lineage`). Each of those ops reads inputs; an input that is
resident then is used as it is, an input that is not (freed by the framework, or itself
recomputed away at that moment) is rebuilt first, temporarily, the same way, and dropped
once the chain is done. The simulator charges the chain's time and memory from this
one description, and the executor replays exactly these steps (memplan.exec.replay).

Memory of a chain beyond the target itself: every temporarily rebuilt input, every other
new output of a replayed op (discarded), and a copy of every other storage a replayed op
writes in place (batch-norm running statistics: the replay must not update them twice).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model import Trace

MAX_CHAIN_DEPTH = 64  # rebuilds nested deeper than this are not followed (a broken plan, not a real chain)


@dataclass(frozen=True, kw_only=True)
class ChainStep:
    """One storage rebuilt by replaying the ops that wrote it."""

    storage: int  # storage id
    ops: tuple[int, ...]  # its writers before the op that needs it, in order
    temporary: bool  # an input rebuilt for this chain only (dropped when it is done)


def recompute_chain(trace: Trace, sid: int, before: int, away: dict[int, list[tuple[int, int]]]) -> tuple[ChainStep, ...]:
    """The steps that rebuild `sid` before op `before`, inputs first (post-order).

    Args:
        trace: the trace.
        sid: the storage to rebuild.
        before: the op that needs it.
        away: per storage, the (out_after, back_before) gaps during which it is recomputed away.
    Returns:
        The steps; the last one rebuilds `sid`.
    """
    steps: list[ChainStep] = []
    _visit(trace, sid, before, away, steps, {sid}, temporary=False, depth=0)
    return tuple(steps)


def _visit(trace: Trace, sid: int, before: int, away, steps: list, seen: set, *, temporary: bool, depth: int) -> None:
    ops, inputs = trace.lineage(sid, before)
    if depth < MAX_CHAIN_DEPTH:
        for r in inputs:
            if r not in seen and not resident(trace, r, before, away):
                seen.add(r)
                _visit(trace, r, before, away, steps, seen, temporary=True, depth=depth + 1)
    steps.append(ChainStep(storage=sid, ops=ops, temporary=temporary))


def resident(trace: Trace, sid: int, op: int, away) -> bool:
    """Alive at `op` and not recomputed away there (swapped-away inputs are the plan's
    business: the validator rejects a recomputation that reads one)."""
    s = trace.storages[sid]
    if not s.alloc_op <= op < s.free_op:
        return False
    return not any(lo < op < hi for lo, hi in away.get(sid, ()))


def chain_seconds(steps: tuple[ChainStep, ...], durations) -> float:
    """Compute time of replaying every op of the chain once per step."""
    return float(sum(durations[j] for step in steps for j in step.ops))


def chain_extra_bytes(trace: Trace, steps: tuple[ChainStep, ...]) -> int:
    """Memory the chain takes beyond its target (see the module docstring)."""
    nbytes = trace.nbytes
    extra = 0
    for step in steps:
        if step.temporary:
            extra += int(nbytes[step.storage])
        for j in step.ops:
            extra += sum(int(nbytes[w]) for w in trace.ops[j].writes if w != step.storage)
    return extra


def chain_inputs(trace: Trace, steps: tuple[ChainStep, ...]) -> set[int]:
    """Resident storages the chain reads (everything read that it does not rebuild)."""
    rebuilt = {step.storage for step in steps}
    return {r for step in steps for j in step.ops for r in trace.ops[j].reads if r not in rebuilt}
