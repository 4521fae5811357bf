"""The kernel's arrays for one lowered plan (memplan.sim.lowering): per decision, per op, per chain.

Everything here is vectorised over the plan's columns (memplan.sim.decisions), and what depends
only on part of the plan is kept while that part is the same: the recompute chains by the
recompute decisions (search planners vary the others too), the frees by the hooked plan's holds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..cost.model import Cost
from ..model import Trace
from ..model.program import HOOKED, INTERPRETED
from .arrays import csr, host_per_op, hooked_host, interpreted_host, producer_ids
from .chains import Chain, OpChains, chain_groups
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
    read_codes: np.ndarray  # int64, sorted: op * storages + storage of each resident storage a chain due at op reads
    read_any: np.ndarray  # bool per storage: read by some chain (most swaps are not: no search for them)

    @classmethod
    def of(cls, chains, read_codes: np.ndarray, n_storages: int) -> ChainArrays:
        """The arrays of `chains` ((decision, chain) pairs) and what they read (`read_codes`)."""
        index = np.fromiter((k for k, _ in chains), dtype=np.int64, count=len(chains))
        values = np.array([c.kernel_row for _, c in chains], dtype=np.float64).reshape(-1, 5)
        return cls.of_rows(index, values, read_codes, n_storages)

    @classmethod
    def of_rows(cls, index: np.ndarray, values: np.ndarray, read_codes: np.ndarray, n_storages: int) -> ChainArrays:
        """The arrays of the chains of decisions `index` given their `kernel_row`s (`values`, one a row)."""
        read_any = np.zeros(n_storages, dtype=np.bool_)
        read_any[read_codes % n_storages] = True
        return cls(index=index, seconds=values[:, 0].copy(), alloc=values[:, 1].astype(np.int64),
                   free=values[:, 2].astype(np.int64), ops=values[:, 3].astype(np.int64), runs=values[:, 4].copy(),
                   read_codes=read_codes, read_any=read_any)


NO_CHAINS = ChainArrays(index=np.zeros(0, dtype=np.int64), seconds=np.zeros(0), alloc=np.zeros(0, dtype=np.int64),
                        free=np.zeros(0, dtype=np.int64), ops=np.zeros(0, dtype=np.int64), runs=np.zeros(0),
                        read_codes=np.zeros(0, dtype=np.int64), read_any=np.zeros(0, dtype=np.bool_))


@dataclass(frozen=True, kw_only=True)
class KernelInputs:
    """What the kernel runs for one lowered plan, budget aside."""

    args: tuple  # memplan.sim._kernel.run_kernel's arguments before budget, record and emit
    wrap: np.ndarray  # per decision: NO_WRAP, HEAD_WRAP or TAIL_WRAP of memplan.sim._codes (for the host's peak)
    link_bytes: np.ndarray  # per decision: bytes over the link each way


@dataclass(frozen=True, kw_only=True)
class Priced:
    """What each decision of a plan moves over the link, and the kernels' times for it."""

    link_bytes: np.ndarray  # int64: bytes over the link each way (compressed where it is); 0 for a recompute
    d2h: np.ndarray  # float64: seconds of its swap-out's copy
    h2d: np.ndarray  # float64: seconds of its prefetch's copy
    comp: np.ndarray  # float64: seconds of its compression kernel (and again of its decompression)

    def take(self, index: np.ndarray) -> Priced:
        """The rows `index` (positions), in that order."""
        return Priced(link_bytes=self.link_bytes[index], d2h=self.d2h[index], h2d=self.h2d[index],
                      comp=self.comp[index])


class Replays:
    """The replay chains of a plan's recompute decisions (memplan.sim.chains), by the op they are due at:
    their kernel columns, the ops the executor records in the step to replay them (repeats included:
    `StepProgram.captured_ops`), and each decision's chain, made only when asked (a search never asks)."""

    def __init__(self, index: np.ndarray, groups: list[OpChains], arrays: ChainArrays, ops: np.ndarray):
        self.index, self.groups, self.arrays, self.ops = index, groups, arrays, ops

    @classmethod
    def of(cls, index: np.ndarray, groups: list[OpChains], n_storages: int) -> Replays:
        """The chains of decisions `index`, due at ops in turn as `groups` (memplan.sim.chains.chain_groups)."""
        # Each op's codes lie in its own range and the ops ascend: concatenated, they are sorted.
        arrays = ChainArrays.of_rows(index, np.concatenate([g.rows for g in groups]),
                                     np.concatenate([g.read_codes for g in groups]), n_storages)
        return cls(index, groups, arrays, np.concatenate([g.ops for g in groups]))

    @cached_property
    def chains(self) -> dict[int, Chain]:
        """The chain of every recompute decision (by index)."""
        return dict(zip(self.index.tolist(), itertools.chain.from_iterable(g.chains for g in self.groups)))


NO_REPLAYS = Replays(NO_CHAINS.index, [], NO_CHAINS, NO_CHAINS.ops)


class Preparer:
    """Prepares lowered plans of one trace and cost for the kernel (per-trace arrays built once)."""

    def __init__(self, trace: Trace, cost: Cost, durations: np.ndarray, lowering: Lowering | None, kernel):
        self.trace, self.cost, self.durations, self.lowering = trace, cost, durations, lowering
        # memplan.sim._events, compiled or interpreted (memplan.sim.kernel_loader)
        self._plan_events, self._floor_load = kernel.plan_events, kernel.floor_load
        n = trace.num_steps
        lives = trace.free_ops > trace.alloc_ops
        self._births = csr(trace.alloc_ops[lives], np.arange(len(trace.storages))[lives], n)
        self._deaths = {(): self._deaths_with({})}  # by the holds of a hooked plan (memplan.sim.lowering)
        self.producers = lowering.regions.producers if lowering is not None else producer_ids(trace)
        # Chains of plans that differ in a few decisions are mostly the same (memplan.sim.memo).
        self._chain_memo = ProbeMemo()
        self._recent_chains: dict[bytes, Replays] = {}
        self._host = host_per_op(trace, cost)
        alive = np.zeros(n + 1, dtype=np.int64)  # bytes of the storages alive at each op (outputs included)
        np.add.at(alive, trace.alloc_ops[lives], trace.nbytes[lives])
        np.add.at(alive, trace.free_ops[lives], -trace.nbytes[lives])
        self._alive = np.cumsum(alive[:-1])
        self._born = np.zeros(n, dtype=np.int64)  # bytes of each op's outputs
        np.add.at(self._born, trace.alloc_ops[lives], trace.nbytes[lives])
        # Cost's copy times are affine in bytes, so they take arrays: each storage's, uncompressed.
        self._d2h, self._h2d = cost.d2h_s(trace.nbytes), cost.h2d_s(trace.nbytes)

    def floor_bytes(self, a: DecisionArrays, carriers=(), chains: ChainArrays = NO_CHAINS) -> int:
        """A lower bound of the peak load of the decisions `a`, whatever their timing; with `carriers`
        ((decision, chain) of a hooked form's region runs) or `chains` (an interpreted form's replays:
        `replays`), counting their memory too (memplan.sim._events.floor_load)."""
        index, transient = chains.index, chains.free
        if carriers:  # not made into ChainArrays: most hooked forms a search bounds are never simulated
            index = np.fromiter((k for k, _ in carriers), dtype=np.int64, count=len(carriers))
            transient = np.fromiter((c.free_bytes for _, c in carriers), dtype=np.int64, count=len(carriers))
        trace = self.trace
        return int(self._floor_load(self._alive, self._born, trace.alloc_ops, trace.free_ops, trace.nbytes,
                                    a.storage, a.out_after, a.back_before, a.prefetch_at, index, transient,
                                    self.producers[a.storage]))

    def priced(self, a: DecisionArrays) -> Priced:
        """What each decision of `a` moves over the link and how long that takes (nothing for a recompute)."""
        swap, sid = a.swap, a.storage
        link_bytes = np.where(swap, self.trace.nbytes[sid], 0)
        d2h, h2d = np.where(swap, self._d2h[sid], 0.0), np.where(swap, self._h2d[sid], 0.0)
        comp = np.zeros(len(a))
        squeezed = swap & (a.ratio > 0)
        if squeezed.any():  # compressed: fewer bytes over the link, a kernel each way
            nbytes = self.trace.nbytes[sid[squeezed]]
            link_bytes[squeezed] = np.round(nbytes * a.ratio[squeezed])
            d2h[squeezed], h2d[squeezed] = self.cost.d2h_s(link_bytes[squeezed]), self.cost.h2d_s(link_bytes[squeezed])
            comp[squeezed] = self.cost.memory_pass_s(nbytes)
        return Priced(link_bytes=link_bytes, d2h=d2h, h2d=h2d, comp=comp)

    def inputs(self, lowered: Lowered, priced: Priced) -> KernelInputs:
        """The kernel's arguments for `lowered` (`priced`: its decisions' copies)."""
        a, cost, trace = lowered.arrays, self.cost, self.trace
        chains = self.chain_arrays(lowered)
        per_op = cost.host_op_s + (cost.executor_s("replay_op") if lowered.level == INTERPRETED else 0.0)
        per_run = cost.executor_s("region") if lowered.level == HOOKED else 0.0
        (kind, wrap, absent, *chain_columns, issue_ptr, issue_ids, need_ptr, need_ids, out_ptr, out_ids,
         wait_first, host, d2h, h2d) = self._plan_events(
            trace.num_steps, len(trace.storages), a.recompute, a.storage, a.out_after, a.back_before, a.prefetch_at,
            priced.d2h, priced.h2d, self.producers, chains.index, chains.seconds, chains.alloc, chains.free,
            per_op * chains.ops + per_run * chains.runs, chains.read_codes, chains.read_any, self._host_of(lowered),
            cost.executor_s("action"), cost.host_async)
        args = (self.durations, trace.nbytes, *self._births, *self._deaths_for(lowered.holds),
                kind, a.storage, a.sync, wrap, priced.link_bytes, d2h, h2d, priced.comp, *chain_columns,
                issue_ptr, issue_ids, need_ptr, need_ids, out_ptr, out_ids,
                absent, a.back_before, wait_first, host, cost.host_async, not cost.captured)
        return KernelInputs(args=args, wrap=wrap, link_bytes=priced.link_bytes)

    def _host_of(self, lowered: Lowered) -> np.ndarray:
        """The host's work per op at `lowered`'s level, before its actions (a hooked program: with its hooks)."""
        if lowered.level == INTERPRETED:
            a = lowered.arrays
            return interpreted_host(self._host[INTERPRETED], self.cost, a.out_after, a.back_before,
                                    self.replays(a).ops if self.cost.executor_s("record_op") else None)
        if lowered.level != HOOKED:
            return self._host[lowered.level]
        if self.cost.executor_s("hook_call") == 0.0:
            return self._host[HOOKED]
        sites = self.lowering.sites
        return hooked_host(self._host[HOOKED], self.cost, sites.firings(lowered.sites), sites.stretches(lowered.sites))

    # --- chains ------------------------------------------------------------------------------

    def chain_arrays(self, lowered: Lowered) -> ChainArrays:
        """The recompute chains of `lowered`: region runs of a hooked plan (memplan.sim.regions), else
        op replays (memplan.sim.chains), those reused for a plan with the same recompute decisions as a
        recent one."""
        a = lowered.arrays
        if lowered.level == HOOKED:
            if not lowered.carriers:  # a run's first decision carries it: none, no runs
                return NO_CHAINS
            return ChainArrays.of(lowered.carriers, lowered.read_codes, len(self.trace.storages))
        return self.replays(a).arrays

    def chains(self, lowered: Lowered) -> dict[int, Chain]:
        """The chain of every recompute decision of `lowered` (for the step program)."""
        if lowered.level == HOOKED:
            return self.lowering.regions.chains(lowered.arrays, lowered.regions, lowered.carriers)
        return self.replays(lowered.arrays).chains

    def replays(self, a: DecisionArrays) -> Replays:
        """The replay chains of `a`'s recompute decisions, reused for a plan with the same ones as a recent
        plan, else put together from the chains due at each op (memplan.sim.chains.chain_groups)."""
        rec = np.flatnonzero(a.recompute)
        if not len(rec):
            return NO_REPLAYS
        key = np.concatenate([rec, a.storage[rec], a.out_after[rec], a.back_before[rec]]).tobytes()
        found = self._recent_chains.get(key)
        if found is None:
            found = Replays.of(*chain_groups(self.trace, a, self.durations, self.producers, self._chain_memo),
                               len(self.trace.storages))
            if len(self._recent_chains) >= RECENT:
                self._recent_chains.clear()
            self._recent_chains[key] = found
        return found

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
