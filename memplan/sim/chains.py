"""What recomputing a storage replays: its producer chain, rebuilding missing inputs first.

A recompute decision rebuilds storage `s` right before op `before` by running again the
ops that wrote it (`Trace.lineage`). Each of those ops reads inputs; an input that is
resident then is used as it is, an input that is not (freed by the framework, or itself
recomputed away at that moment) is rebuilt first, temporarily, the same way. The chains
of one op run in producer order (then decision order) and share what they rebuild: an
input rebuilt for one is resident for the next, every temporary input is dropped once the
op's last chain is done, and when a replayed op also makes another storage recomputed at
that op (batch norm's saved statistics beside its output) that storage is taken from the
replay and its own chain is empty. So a checkpointed segment runs its forward ops once.
A temporary input is dropped right after the last chain of the op that reads it.
The simulator charges the chains' time and memory from this one description, and the
executor replays exactly these steps (memplan.exec.replay).

Memory of a chain: its target and the storages it adopts stay resident; the inputs it
rebuilds stay until the last chain of the op that reads them is done; for each replayed
op, its other new outputs (discarded) and a copy of every other storage it writes in place
(batch-norm running statistics: the replay must not update them twice) exist while that op
runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..model import Decision, Trace

MAX_CHAIN_DEPTH = 64  # rebuilds nested deeper than this are not followed (a broken plan, not a real chain)


@dataclass(frozen=True, kw_only=True)
class ChainStep:
    """One storage rebuilt by replaying the ops that wrote it."""

    storage: int  # storage id
    ops: tuple[int, ...]  # its writers before the op that needs it, in order
    temporary: bool  # an input rebuilt for this op's chains only (dropped when they are done)


@dataclass(frozen=True, kw_only=True)
class Chain:
    """The recomputation of one decision."""

    steps: tuple[ChainStep, ...]  # inputs first; the last step rebuilds the target (none when adopted)
    adopted: tuple[int, ...]  # other storages recomputed at this op that its replays make
    seconds: float  # compute time of its replays
    alloc_bytes: int  # allocated when it starts (target, adopted, temporaries, largest transient)
    transient_bytes: int  # freed as soon as it is done (the largest replayed op's discarded outputs)
    frees: tuple[int, ...] = ()  # temporary inputs (its own or earlier chains') last read by it
    free_bytes: int = 0  # freed when it is done: transient_bytes plus the bytes of `frees`


def plan_chains(trace: Trace, decisions, durations: np.ndarray, producers: np.ndarray) -> dict[int, Chain]:
    """The chain of every recompute decision (by index), in the order the simulator runs them."""
    recomputes = [k for k, d in enumerate(decisions) if d.action == "recompute"]
    away = _recompute_gaps([decisions[k] for k in recomputes])
    order = sorted(recomputes, key=lambda k: (decisions[k].back_before, producers[decisions[k].storage], k))
    chains: dict[int, Chain] = {}
    done: dict[int, set] = {}  # per op: storages its chains rebuilt so far
    pending: dict[int, set] = {}  # per op: targets whose chain has not run yet
    for k in order:
        pending.setdefault(decisions[k].back_before, set()).add(decisions[k].storage)
    for k in order:
        d = decisions[k]
        rebuilt, waiting = done.setdefault(d.back_before, set()), pending[d.back_before]
        waiting.discard(d.storage)
        if d.storage in rebuilt:  # an earlier chain's replay made it
            chains[k] = Chain(steps=(), adopted=(), seconds=0.0, alloc_bytes=0, transient_bytes=0)
            continue
        chains[k] = _chain(trace, d, away, rebuilt, waiting, durations)
    return _with_frees(trace, chains, order, decisions)


def _with_frees(trace: Trace, chains: dict[int, Chain], order: list[int], decisions) -> dict[int, Chain]:
    """Each temporary input freed after the last chain of its op that reads it."""
    frees: dict[int, list[int]] = {}
    last: dict[int, int] = {}  # temporary storage of the current op -> the chain that reads it last
    for i, k in enumerate(order):
        chain = chains[k]
        made = {s.storage for s in chain.steps if s.temporary}
        for storage in made | (chain_reads(trace, chain) & set(last)):
            last[storage] = k
        if i + 1 == len(order) or decisions[order[i + 1]].back_before != decisions[k].back_before:
            for storage, owner in last.items():
                frees.setdefault(owner, []).append(storage)
            last = {}
    nbytes = trace.nbytes
    return {k: replace(c, frees=tuple(sorted(frees.get(k, ()))),
                       free_bytes=c.transient_bytes + sum(int(nbytes[s]) for s in frees.get(k, ())))
            for k, c in chains.items()}


def _chain(trace: Trace, d: Decision, away, rebuilt: set, waiting: set, durations) -> Chain:
    steps: list[ChainStep] = []
    rebuilt.add(d.storage)
    _visit(trace, d.storage, d.back_before, away, steps, rebuilt, temporary=False, depth=0)
    nbytes = trace.nbytes
    adopted, transient = [], 0
    for step in steps:
        for j in step.ops:
            made = 0
            for w in trace.ops[j].writes:
                if w == step.storage:
                    continue
                if w in waiting and _made_by(trace, w, j):
                    adopted.append(w)
                    waiting.discard(w)
                    rebuilt.add(w)
                else:
                    made += int(nbytes[w])
            transient = max(transient, made)
    temporary = sum(int(nbytes[s.storage]) for s in steps if s.temporary)
    kept = int(nbytes[d.storage]) + sum(int(nbytes[w]) for w in adopted)
    return Chain(steps=tuple(steps), adopted=tuple(adopted), seconds=float(sum(durations[j] for s in steps for j in s.ops)),
                 alloc_bytes=kept + temporary + transient, transient_bytes=transient)


def _visit(trace: Trace, sid: int, before: int, away, steps: list, seen: set, *, temporary: bool, depth: int) -> None:
    ops, inputs = trace.lineage(sid, before)
    if depth < MAX_CHAIN_DEPTH:
        for r in inputs:
            if r not in seen and not resident(trace, r, before, away):
                seen.add(r)
                _visit(trace, r, before, away, steps, seen, temporary=True, depth=depth + 1)
    steps.append(ChainStep(storage=sid, ops=ops, temporary=temporary))


def _made_by(trace: Trace, sid: int, op: int) -> bool:
    """True when op `op` makes storage `sid` (a new output, not an update in place)."""
    s = trace.storages[sid]
    return not s.persistent and s.alloc_op == op


def resident(trace: Trace, sid: int, op: int, away) -> bool:
    """Alive at `op` and not recomputed away there (swapped-away inputs are the plan's
    business: the validator rejects a recomputation that reads one)."""
    s = trace.storages[sid]
    if not s.alloc_op <= op < s.free_op:
        return False
    return not any(lo < op < hi for lo, hi in away.get(sid, ()))


def chain_reads(trace: Trace, chain: Chain) -> set[int]:
    """Every storage the chain's replayed ops read."""
    return {r for step in chain.steps for j in step.ops for r in trace.ops[j].reads}


def chain_inputs(trace: Trace, chain: Chain) -> set[int]:
    """Resident storages the chain reads (everything read that it does not rebuild)."""
    return chain_reads(trace, chain) - {step.storage for step in chain.steps}


def _recompute_gaps(decisions) -> dict[int, list[tuple[int, int]]]:
    """Per storage, the (out_after, back_before) gaps during which it is recomputed away."""
    away: dict[int, list[tuple[int, int]]] = {}
    for d in decisions:
        away.setdefault(d.storage, []).append((d.out_after, d.back_before))
    return away
