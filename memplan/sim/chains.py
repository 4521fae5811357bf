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
executor replays exactly these steps (memplan.exec.op_replay).

Memory of a chain: its target and the storages it adopts stay resident; the inputs it
rebuilds stay until the last chain of the op that reads them is done; for each replayed
op, its other new outputs (discarded) and a copy of every other storage it writes in place
(batch-norm running statistics: the replay must not update them twice) exist while that op
runs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from ..model import Trace
from .decisions import DecisionArrays
from .memo import MISS, ProbeMemo

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
    inputs: frozenset = frozenset()  # resident storages it reads (everything read that it does not rebuild)

    @cached_property
    def kernel_row(self) -> tuple[float, int, int, int, bool]:
        """What the simulator's kernel reads of it: (seconds, alloc_bytes, free_bytes, ops replayed,
        whether it runs at all)."""
        return self.seconds, self.alloc_bytes, self.free_bytes, sum(len(s.ops) for s in self.steps), bool(self.steps)


def plan_chains(trace: Trace, decisions, durations: np.ndarray, producers: np.ndarray) -> dict[int, Chain]:
    """The chain of every recompute decision (by index), in the order the simulator runs them (a search
    that simulates many plans reuses them through `chain_groups`' memo)."""
    return chains_of(trace, DecisionArrays.of(decisions), durations, producers)


def chains_of(trace: Trace, arrays: DecisionArrays, durations: np.ndarray, producers: np.ndarray) -> dict[int, Chain]:
    """`plan_chains` of decisions given as columns (memplan.sim.decisions)."""
    recomputes = np.flatnonzero(arrays.recompute)
    sid, back = arrays.storage[recomputes], arrays.back_before[recomputes]
    away = _recompute_gaps(sid.tolist(), arrays.out_after[recomputes].tolist(), back.tolist())
    order = np.lexsort((recomputes, producers[sid], back))
    rows = zip(recomputes[order].tolist(), sid[order].tolist(), back[order].tolist())
    chains: dict[int, Chain] = {}
    resident = _Resident(trace, away, {})
    for op, group in itertools.groupby(rows, key=lambda row: row[2]):
        ks, targets, _ = zip(*group)
        resident.move(op)
        chains.update(zip(ks, _op_chains(trace, op, targets, resident, durations)))
    return chains


@dataclass(frozen=True, kw_only=True, eq=False)
class OpChains:
    """The chains of the recompute decisions due at one op, in the order they run, and what the
    simulator's kernel reads of them (made once per memo entry, not once per plan)."""

    chains: tuple[Chain, ...]
    rows: np.ndarray  # float64, (chains, 5): each chain's `kernel_row`
    read_codes: np.ndarray  # int64, ascending: op * storages + each resident storage they read
    ops: np.ndarray  # int64: every op they replay (repeats included)

    @classmethod
    def of(cls, trace: Trace, op: int, chains: tuple[Chain, ...]) -> OpChains:
        read = sorted(set().union(*(c.inputs for c in chains)))
        return cls(chains=chains, rows=np.array([c.kernel_row for c in chains], dtype=np.float64).reshape(-1, 5),
                   read_codes=op * len(trace.storages) + np.array(read, dtype=np.int64),
                   ops=np.array([j for c in chains for step in c.steps for j in step.ops], dtype=np.int64))


def chain_groups(trace: Trace, arrays: DecisionArrays, durations: np.ndarray, producers: np.ndarray,
                 memo: ProbeMemo | None = None) -> tuple[np.ndarray, list[OpChains]]:
    """`chains_of` by op: the recompute decisions in the order their chains run, and the chains due at
    each of their ops (ascending) in turn, reused from `memo` as `chains_of` reuses them, with what
    the kernel reads of them (`OpChains`)."""
    recomputes = np.flatnonzero(arrays.recompute)
    sid, back = arrays.storage[recomputes], arrays.back_before[recomputes]
    away = _recompute_gaps(sid.tolist(), arrays.out_after[recomputes].tolist(), back.tolist())
    order = np.lexsort((recomputes, producers[sid], back))
    sids, backs = sid[order].tolist(), back[order]
    starts = [0, *(np.flatnonzero(np.diff(backs)) + 1).tolist(), len(sids)]
    backs = backs.tolist()
    memo = ProbeMemo() if memo is None else memo
    resident = _Resident(trace, away, memo.facts)  # one probe for the plan, moved from op to op
    groups = []
    for lo, hi in zip(starts, starts[1:]):  # the loop a search runs for every plan: kept lean
        op = backs[lo]
        resident.move(op)
        key = (op, tuple(sids[lo:hi]))
        found = resident.lookup(memo, key)
        groups.append(found if found is not MISS else memo.record(key, resident, _made(trace, *key, durations)))
    return recomputes[order], groups


def _made(trace: Trace, op: int, targets: tuple[int, ...], durations):
    """The memo's computation of the chains due at `op`, given the probe it asks."""
    return lambda ask: OpChains.of(trace, op, _op_chains(trace, op, targets, ask, durations))


def _op_chains(trace: Trace, op: int, targets: tuple[int, ...], resident_at, durations) -> tuple[Chain, ...]:
    """The chains of the recomputations due at `op`, in the order they run (they share rebuilt inputs)."""
    rebuilt: set = set()  # storages the chains so far rebuilt
    waiting = set(targets)  # targets whose chain has not run yet
    out = []
    for sid in targets:
        waiting.discard(sid)
        if sid in rebuilt:  # an earlier chain's replay made it
            out.append(Chain(steps=(), adopted=(), seconds=0.0, alloc_bytes=0, transient_bytes=0))
            continue
        out.append(_chain(trace, sid, op, resident_at, rebuilt, waiting, durations))
    return _with_frees(trace, out)


def _with_frees(trace: Trace, chains: list[Chain]) -> tuple[Chain, ...]:
    """Each temporary input of one op's chains freed after the last of them that reads it."""
    frees: list[list[int]] = [[] for _ in chains]
    last: dict[int, int] = {}  # temporary storage -> the chain that reads it last
    for i, chain in enumerate(chains):
        made = {s.storage for s in chain.steps if s.temporary}
        for storage in made | (chain_reads(trace, chain) & set(last)):
            last[storage] = i
    for storage, owner in last.items():
        frees[owner].append(storage)
    nbytes = trace.nbytes
    return tuple(replace(c, frees=tuple(sorted(f)), free_bytes=c.transient_bytes + sum(int(nbytes[s]) for s in f),
                         inputs=frozenset(chain_inputs(trace, c)))
                 for c, f in zip(chains, frees))


def _chain(trace: Trace, sid: int, op: int, resident_at, rebuilt: set, waiting: set, durations) -> Chain:
    steps: list[ChainStep] = []
    rebuilt.add(sid)
    _visit(trace, sid, op, resident_at, steps, rebuilt, temporary=False, depth=0)
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
    kept = int(nbytes[sid]) + sum(int(nbytes[w]) for w in adopted)
    return Chain(steps=tuple(steps), adopted=tuple(adopted), seconds=float(sum(durations[j] for s in steps for j in s.ops)),
                 alloc_bytes=kept + temporary + transient, transient_bytes=transient)


def _visit(trace: Trace, sid: int, before: int, resident_at, steps: list, seen: set, *, temporary: bool,
           depth: int) -> None:
    ops, inputs = trace.lineage(sid, before)
    if depth < MAX_CHAIN_DEPTH and inputs:
        for r, here in zip(inputs, resident_at(inputs)):  # one question for all inputs (memplan.sim.memo)
            if r not in seen and not here:
                seen.add(r)
                _visit(trace, r, before, resident_at, steps, seen, temporary=True, depth=depth + 1)
    steps.append(ChainStep(storage=sid, ops=ops, temporary=temporary))


def _made_by(trace: Trace, sid: int, op: int) -> bool:
    """True when op `op` makes storage `sid` (a new output, not an update in place)."""
    s = trace.storages[sid]
    return not s.persistent and s.alloc_op == op


def chain_reads(trace: Trace, chain: Chain) -> set[int]:
    """Every storage the chain's replayed ops read."""
    return {r for step in chain.steps for j in step.ops for r in trace.ops[j].reads}


def chain_inputs(trace: Trace, chain: Chain) -> set[int]:
    """Resident storages the chain reads (everything read that it does not rebuild)."""
    return chain_reads(trace, chain) - {step.storage for step in chain.steps}


class _Resident:
    """The memo's probe at op `op` (`move` sets it; one probe for a plan's chains): for each of a
    tuple of storages, whether it is resident then: alive and not recomputed away there (`away`: the
    plan's recompute gaps by storage; swapped-away inputs are the plan's business: the validator
    rejects a recomputation that reads one).

    `alive` caches, per op and storages, whether each is in its lifetime then (it never changes): for
    the usual tuple, none of which a recompute takes away, that is the answer.
    """

    __slots__ = ("storages", "away", "alive", "op", "_alive_at")

    def __init__(self, trace: Trace, away: dict, alive: dict):
        self.storages, self.away, self.alive = trace.storages, away, alive
        self.op, self._alive_at = -1, {}

    def move(self, op: int) -> None:
        """Ask about op `op` from now on."""
        self.op = op
        self._alive_at = self.alive.setdefault(op, {})

    def __call__(self, sids: tuple[int, ...]) -> tuple[bool, ...]:
        here = self._alive_at.get(sids)
        if here is None or not self.away.keys().isdisjoint(sids):
            return self._asked(sids)
        return here

    def lookup(self, memo: ProbeMemo, key):
        """`memo.lookup(key, self)`, its walk inlined with the answer of the usual tuple (one walk per op
        with recomputations, for every plan a search scores): a node of `key` is always asked at its op, so
        the child the lifetimes' answer leads to is kept on it (`_Node.usual`)."""
        node, away = memo.roots.get(key), self.away.keys()
        while node is not None:
            sids = node.item
            if sids is MISS:
                return node.value
            if away.isdisjoint(sids):
                usual = node.usual
                if usual is None:
                    usual = node.usual = node.children.get(self._alive_at.get(sids))
                node = usual
            else:
                node = node.children.get(self._asked(sids))
        return MISS

    def _asked(self, sids: tuple[int, ...]) -> tuple[bool, ...]:
        op, at = self.op, self._alive_at
        here = at.get(sids)
        if here is None:
            storages = self.storages
            here = at[sids] = tuple(storages[s].alloc_op <= op < storages[s].free_op for s in sids)
        away = self.away
        if away.keys().isdisjoint(sids):
            return here
        answers = list(here)
        for i, s in enumerate(sids):  # a plain loop: a search asks this for most plans
            if answers[i] and s in away:
                for lo, hi in away[s]:
                    if lo < op < hi:
                        answers[i] = False
                        break
        return tuple(answers)


def _recompute_gaps(storages, outs, backs) -> dict[int, list[tuple[int, int]]]:
    """Per storage, the (out_after, back_before) gaps during which it is recomputed away."""
    away: dict[int, list[tuple[int, int]]] = {}
    for s, lo, hi in zip(storages, outs, backs):
        away.setdefault(s, []).append((lo, hi))
    return away
