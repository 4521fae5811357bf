"""The kernel's arrays for one lowered plan (memplan.sim.lowering): per decision, per op, per chain.

Everything here is vectorised over the plan's columns (memplan.sim.decisions), and what depends
only on part of the plan is kept while that part is the same: the recompute chains by the
recompute decisions (search planners vary the others too), the frees by the hooked plan's holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost.model import Cost
from ..model import Trace
from ..model.program import HOOKED, INTERPRETED
from . import _codes as K
from .arrays import csr, event_csr, host_per_op
from .chains import Chain, chains_of
from .decisions import DecisionArrays
from .lowering import Lowered, Lowering
from .memo import ProbeMemo

RECENT = 4096  # chains and frees kept by the decisions they depend on (bounds their memory)


@dataclass(frozen=True, kw_only=True)
class ChainArrays:
    """The recompute chains of a lowered plan as the kernel reads them, one row a chain."""

    index: np.ndarray  # int64: the decision each chain is for
    seconds: np.ndarray  # float64: its compute time
    alloc: np.ndarray  # int64: bytes allocated when it starts
    free: np.ndarray  # int64: bytes freed when it is done
    ops: np.ndarray  # int64: ops it replays (the host issues each)
    runs: np.ndarray  # float64: 1.0 where it runs at all (a region run costs the host once), else 0.0
    reads: frozenset  # (op, storage): resident storages a chain due at that op reads
    read: np.ndarray  # int64: the storages of `reads`

    @classmethod
    def of(cls, chains: list[tuple[int, Chain]], back: np.ndarray) -> ChainArrays:
        """The arrays of `chains` ((decision, chain) pairs; `back`: each decision's back_before)."""
        index = np.fromiter((k for k, _ in chains), dtype=np.int64, count=len(chains))
        values = np.array([(c.seconds, c.alloc_bytes, c.free_bytes, sum(len(s.ops) for s in c.steps), bool(c.steps))
                           for _, c in chains], dtype=np.float64).reshape(-1, 5)
        reads = frozenset((int(back[k]), r) for k, c in chains for r in c.inputs)
        return cls(index=index, seconds=values[:, 0].copy(), alloc=values[:, 1].astype(np.int64),
                   free=values[:, 2].astype(np.int64), ops=values[:, 3].astype(np.int64), runs=values[:, 4].copy(),
                   reads=reads, read=np.fromiter({r for _, r in reads}, dtype=np.int64))


NO_CHAINS = ChainArrays(index=np.zeros(0, dtype=np.int64), seconds=np.zeros(0), alloc=np.zeros(0, dtype=np.int64),
                        free=np.zeros(0, dtype=np.int64), ops=np.zeros(0, dtype=np.int64), runs=np.zeros(0),
                        reads=frozenset(), read=np.zeros(0, dtype=np.int64))


@dataclass(frozen=True, kw_only=True)
class KernelInputs:
    """What the kernel runs for one lowered plan, budget aside."""

    args: tuple  # memplan.sim._kernel.run_kernel's arguments before budget, record and emit
    wrap: np.ndarray  # per decision: K.NO_WRAP, K.HEAD_WRAP or K.TAIL_WRAP (for the host's peak)
    link_bytes: np.ndarray  # per decision: bytes over the link each way


class Preparer:
    """Prepares lowered plans of one trace and cost for the kernel (per-trace arrays built once)."""

    def __init__(self, trace: Trace, cost: Cost, durations: np.ndarray, lowering: Lowering | None):
        self.trace, self.cost, self.durations, self.lowering = trace, cost, durations, lowering
        n = trace.num_steps
        lives = trace.free_ops > trace.alloc_ops
        self._births = csr(trace.alloc_ops[lives], np.arange(len(trace.storages))[lives], n)
        self._deaths = {(): self._deaths_with({})}  # by the holds of a hooked plan (memplan.sim.lowering)
        # Recomputes at one op run in producer order, so a chain finds its inputs rebuilt.
        self.producers = np.array([-1 if trace.producer(s) is None else trace.producer(s)
                                   for s in range(len(trace.storages))], dtype=np.int64)
        # Chains of plans that differ in a few decisions are mostly the same (memplan.sim.memo).
        self._chain_memo = ProbeMemo()
        self._recent_chains: dict[bytes, tuple[dict, ChainArrays]] = {}
        self._host = host_per_op(trace, cost)

    def inputs(self, lowered: Lowered) -> KernelInputs:
        """The kernel's arguments for `lowered` (vectorised over its decisions)."""
        a, cost, n = lowered.arrays, self.cost, self.trace.num_steps
        sid, out_after, back, trigger, swap = a.storage, a.out_after, a.back_before, a.prefetch_at, a.swap
        kind = np.where(a.recompute, K.RECOMPUTE, K.SWAP).astype(np.int64)
        ratio, nbytes = a.ratio, self.trace.nbytes[sid]
        link_bytes = np.where(swap, np.where(ratio > 0, np.round(nbytes * ratio), nbytes), 0).astype(np.int64)
        # Cost's copy and kernel times are affine in bytes, so they take arrays.
        d2h = np.where(swap, cost.d2h_s(link_bytes), 0.0)
        h2d = np.where(swap, cost.h2d_s(link_bytes), 0.0)
        comp = np.where(swap & (ratio > 0), cost.memory_pass_s(nbytes), 0.0)
        wrap = np.where(swap & a.wraps, np.where(trigger > out_after, K.TAIL_WRAP, K.HEAD_WRAP), K.NO_WRAP)
        wrap = wrap.astype(np.int64)
        absent = np.zeros(len(self.trace.storages), dtype=np.bool_)
        absent[sid[wrap == K.HEAD_WRAP]] = True
        chains = self.chain_arrays(lowered)
        chain_columns = self._per_decision(chains, len(a), lowered.level)
        ids = np.arange(len(sid))
        rank = np.where(swap, -1, self.producers[sid])
        host = self._host[lowered.level]
        if len(sid) and (cost.executor_s("action") or not cost.host_async):
            host = host.copy()  # actions: swap: out, release, prefetch, wait; recompute: drop, run
            acts = np.concatenate([out_after, back, out_after[swap], trigger[swap]])  # two per decision, four a swap
            np.add.at(host, acts, cost.executor_s("action"))
            if not cost.host_async:  # the CPU copies on its one thread (memplan.exec.engine), nothing beside
                np.add.at(host, out_after[swap], d2h[swap])
                np.add.at(host, trigger[swap], h2d[swap])
                d2h, h2d = np.zeros_like(d2h), np.zeros_like(h2d)
        args = (self.durations, self.trace.nbytes, *self._births, *self._deaths_for(lowered.holds),
                kind, sid, a.sync, wrap, link_bytes, d2h, h2d, comp, *chain_columns,
                *event_csr(trigger[swap], np.zeros(int(swap.sum()), dtype=np.int64), ids[swap], n),
                *event_csr(back, rank, ids, n), *event_csr(out_after, np.zeros(len(sid), dtype=np.int64), ids, n),
                absent, back, self._wait_first(a, chains), host, cost.host_async)
        return KernelInputs(args=args, wrap=wrap, link_bytes=link_bytes)

    # --- chains ------------------------------------------------------------------------------

    def chain_arrays(self, lowered: Lowered) -> ChainArrays:
        """The recompute chains of `lowered`: region runs of a hooked plan (memplan.sim.regions), else
        op replays (memplan.sim.chains), those reused for a plan with the same recompute decisions as a
        recent one."""
        a = lowered.arrays
        if lowered.level == HOOKED:
            if not lowered.regions:
                return NO_CHAINS
            ordered = self.lowering.regions.ordered(a, lowered.regions, self.producers)
            return ChainArrays.of([(k, c) for k, c in ordered if c is not None], a.back_before)
        return self._replays(a)[1]

    def chains(self, lowered: Lowered) -> dict[int, Chain]:
        """The chain of every recompute decision of `lowered` (for the step program)."""
        if lowered.level == HOOKED:
            return self.lowering.regions.chains(lowered.arrays, lowered.regions, self.producers) \
                if lowered.regions else {}
        return self._replays(lowered.arrays)[0]

    def _replays(self, a: DecisionArrays) -> tuple[dict[int, Chain], ChainArrays]:
        rec = np.flatnonzero(a.recompute)
        if not len(rec):
            return {}, NO_CHAINS
        key = np.concatenate([rec, a.storage[rec], a.out_after[rec], a.back_before[rec]]).tobytes()
        found = self._recent_chains.get(key)
        if found is None:
            chains = chains_of(self.trace, a, self.durations, self.producers, self._chain_memo)
            found = (chains, ChainArrays.of(list(chains.items()), a.back_before))
            if len(self._recent_chains) >= RECENT:
                self._recent_chains.clear()
            self._recent_chains[key] = found
        return found

    def _per_decision(self, chains: ChainArrays, n: int, level: str) -> tuple[np.ndarray, ...]:
        """Per decision: chain seconds, bytes allocated when it starts and freed when it is done, and
        the host's work to issue its ops (replayed through Python when interpreted)."""
        per_op = self.cost.host_op_s + (self.cost.executor_s("replay_op") if level == INTERPRETED else 0.0)
        per_run = self.cost.executor_s("region") if level == HOOKED else 0.0
        seconds, alloc, freed, host = np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), np.zeros(n)
        k = chains.index
        seconds[k], alloc[k], freed[k] = chains.seconds, chains.alloc, chains.free
        host[k] = per_op * chains.ops + per_run * chains.runs
        return seconds, alloc, freed, host

    @staticmethod
    def _wait_first(a: DecisionArrays, chains: ChainArrays) -> np.ndarray:
        """Swaps whose storage lands at an op where a recomputation reads it: they land first."""
        out = np.zeros(len(a), dtype=np.bool_)
        if not chains.reads:
            return out
        for k in np.flatnonzero(a.swap & np.isin(a.storage, chains.read)).tolist():
            out[k] = (int(a.back_before[k]), int(a.storage[k])) in chains.reads
        return out

    # --- frees -------------------------------------------------------------------------------

    def _deaths_for(self, holds: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
        key = tuple(sorted(holds.items()))
        if key not in self._deaths:
            if len(self._deaths) >= RECENT:
                self._deaths = {(): self._deaths[()]}
            self._deaths[key] = self._deaths_with(holds)
        return self._deaths[key]

    def _deaths_with(self, holds: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """Storages grouped by the op after which they are freed, some held longer (`holds`)."""
        trace = self.trace
        free = trace.free_ops.copy()
        for sid, until in holds.items():
            free[sid] = max(free[sid], min(until, trace.num_steps))
        alive = free > trace.alloc_ops
        return csr(free[alive] - 1, np.arange(len(trace.storages))[alive], trace.num_steps)
