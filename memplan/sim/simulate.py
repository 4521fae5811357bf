"""The discrete-event simulator every planner is judged by.

Semantics (the contract; docs/simulator.md, "Simulation", says it for users):

- One compute stream runs the ops in trace order for `cost.durations` (a pool-only trace,
  without ops, runs its time axis as steps that take no time). Two copy engines,
  device-to-host and host-to-device, are each FIFO: a copy starts at max(its issue time,
  the end of the engine's previous copy) and takes `cost.d2h_s` / `cost.h2d_s` of its bytes;
  a prefetch never starts before its own swap-out has reached the host.
- Memory load = resident storages plus buffers being copied. A storage is resident for ops
  [alloc_op, free_op): allocated when op alloc_op starts, released when op free_op-1 ends.
  The budget caps the load: an allocation waits (memory_stall_s) for swap-outs in flight to
  complete; when nothing pending can free enough, the plan is infeasible and the result
  names the op and the shortfall.
- Per op i, in order: (1) prefetches triggered at i allocate their bytes (waiting if needed)
  and enqueue their host-to-device copy; (2) the prefetches of op i that a recomputation
  reads land, then recomputations needed by i, in producer order, allocate their storage
  plus the chain's extra memory and run their producer chain on the compute stream
  (recompute_s; memplan.sim.chains says what a chain rebuilds); (3) op i's new outputs are
  allocated; (4) op i waits for its other prefetches to land (prefetch_stall_s) and
  decompresses them; (5) op i runs; (6) storages whose lifetime ends are released, and
  swap-outs after op i start: compressed (a kernel on the compute stream) and enqueued on
  the device-to-host engine (an uncompressed `overlap` swap-out is enqueued as of op i's
  start: it ran beside op i, which only read it); their memory is released when the copy completes, or, if
  `sync`, the compute stream waits for it (sync_stall_s). Recompute decisions release at once.
- A swap-out's memory is released lazily: at the start of the first op after its copy
  completed, or earlier, waiting for it, when an allocation needs the room. These release
  points, with every prefetch, wait, recompute, swap-out and drop, are the step program
  (`compile_program`) the executor runs: memory follows the program exactly whatever the
  real copy times are; a copy slower than simulated makes the executor wait at the release.
- Convolution decisions (`plan.microbatches`): a decided op runs for its kernels' times and
  holds their largest workspace while it runs, as a storage it writes (memplan.sim.convview).
  Overhead is against the trace as the cost model prices it.
- Wrap-around decisions (weights, optimizer state), steady state: with the trigger in the
  head [0, back_before] the storage starts the iteration on the host; with the trigger in
  the tail it starts resident and the tail prefetch (for the next iteration) holds its
  bytes until the end.
- The host issues every op (and a recomputation's ops) before the device runs it: the cost
  model's host work per op (`Cost.host_op_s`, none where measured op times hold it), plus what
  the executor adds at the plan's level (memplan.sim.lowering): a hook per saved-tensor pack and
  unpack (hooked), the dispatch mode per op and each replayed op (interpreted), and each
  action. A GPU's host runs ahead on its own clock and the device waits for it only when it
  catches up (host_s); the CPU is its own device: its host work adds to the step, and so do
  its copies, which it makes itself (memplan.exec.engine) instead of on copy engines.
- The iteration ends when the compute stream finishes, plus, in steady state, the wait the
  next iteration (taken to repeat this one) would have for wrap-around copies: a tail
  prefetch landing after its op's start there, or a head prefetch there delayed by this
  iteration's swap-out or host-to-device queue beyond its slack. The largest such lateness is
  charged once, as prefetch_stall_s. overlap_s is the copy time hidden behind compute (copy
  busy time minus the stalls, at least 0).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from types import ModuleType

import numpy as np

from ..budget import NO_LIMIT, Budget, budget_given, budget_in_force, limited
from ..cost.model import Cost
from ..cost.profiles import DeviceProfile, profile_from_json
from ..model import Plan, Trace, check_plan, expect_trace
from ..problem import DEFAULT_PROFILE, Problem
from . import _codes as K
from .kernel_loader import compiled
from .arrays import csr, event_csr, host_peak, host_per_op
from .chains import plan_chains
from .convview import conv_view
from .lowering import HOOKED, INTERPRETED, PLAIN, Lowered, Lowering
from .memo import ProbeMemo
from .result import SimResult

NO_TRIGGER = -1  # placeholder for Decision.trigger None while extracting fields
RECENT_CHAINS = 4096  # plans' recompute chains kept by their recompute decisions
MICRO_BATCHES = "micro-batched convolutions run op by op"  # why such a plan is interpreted


def simulate(trace: Trace, plan: Plan | None = None, profile: str | DeviceProfile | None = None,
             budget: Budget | str | int | float | None = None, cost: Cost | None = None,
             timeline: bool = False) -> SimResult:
    """Simulate one iteration of `trace` under `plan` and `budget`.

    Args:
        trace: the traced iteration.
        plan: the plan (checked to belong to `trace`); None keeps everything resident.
        profile: the cost model's profile, a name, file or DeviceProfile (ignored when `cost` is
            given); None: the profile the plan was made for, else DEFAULT_PROFILE.
        budget: None: the plan's own budget (no cap without a plan, or for a plan made
            without one); "none": no cap; else bytes, "8GiB", "60%" or a share in (0, 1].
        cost: precomputed durations for this trace.
        timeline: also return the load timeline, op start times and stream lanes.
    Returns:
        The SimResult; its `budget_bytes` and `budget_source` say which cap was used.
    Raises:
        PlanMismatchError: the plan is for another trace or names what it does not have.
        MemplanError: a bad budget.
    """
    expect_trace(trace, "simulate")
    if plan is not None:
        check_plan(trace, plan)
    own = NO_LIMIT if plan is None else plan.budget_bytes
    budget_bytes, source = budget_in_force(budget_given(budget), own, trace.peak_load_bytes)
    result = Simulator(trace, plan_cost(trace, plan, profile, cost)).run(plan, budget_bytes, timeline=timeline)
    return replace(result, budget_bytes=budget_bytes, budget_source=source)


def plan_cost(trace: Trace, plan: Plan | None, profile: str | DeviceProfile | None = None,
              cost: Cost | None = None) -> Cost:
    """What `plan` is timed on: `cost` when given, else `trace` priced on the profile
    `simulation_profile` picks (the one given, else the plan's own, else DEFAULT_PROFILE).

    Raises:
        MemplanError: the plan's recorded profile is damaged; UnknownNameError: an unknown profile.
    """
    if cost is not None:
        return cost
    return Problem.of(trace, profile=simulation_profile(plan, profile)[0]).cost


def simulation_profile(plan: Plan | None, profile: str | DeviceProfile | None) -> tuple[str | DeviceProfile, str]:
    """(profile, where it came from: "given", "plan" or "default") for `simulate`: `profile`,
    else the profile the plan was made for, else DEFAULT_PROFILE.

    Raises:
        MemplanError: the plan's recorded profile is damaged.
    """
    if profile is not None:
        return profile, "given"
    if plan is not None and plan.profile:
        return profile_from_json(plan.profile, "the plan's device profile"), "plan"
    return DEFAULT_PROFILE, "default"


class Simulator:
    """A simulator bound to one trace and cost model: per-trace arrays are built once.

    Search planners create one and call `run` thousands of times.
    """

    def __init__(self, trace: Trace, cost: Cost, kernel: ModuleType | None = None, hooks: bool = True):
        self.trace = trace
        self.cost = cost
        self._kernel = kernel or compiled()  # memplan.sim.kernel_loader: compiled, or interpreted for one run
        n = trace.num_steps
        self._births = csr(trace.alloc_ops[trace.free_ops > trace.alloc_ops],
                            np.arange(len(trace.storages))[trace.free_ops > trace.alloc_ops], n)
        self._deaths = {(): self._deaths_with({})}  # by the holds of a hooked plan (memplan.sim.lowering)
        # A pool-only trace (no ops) runs its time axis as steps that take no time.
        self._durations = np.zeros(n) if not trace.ops else np.ascontiguousarray(cost.durations, dtype=np.float64)
        self._prefix = np.concatenate([[0.0], np.cumsum(self._durations)])
        # Recomputes at one op run in producer order, so a chain finds its inputs rebuilt.
        self._producers = np.array([-1 if trace.producer(s) is None else trace.producer(s)
                                    for s in range(len(trace.storages))], dtype=np.int64)
        # Chains of plans that differ in a few decisions are mostly the same (memplan.sim.memo).
        self._chain_memo = ProbeMemo()
        self._recent_chains: dict[tuple, dict] = {}
        self.lowering = Lowering(trace, self._durations) if hooks and trace.ops else None
        self._host = host_per_op(trace, cost)
        # The kernel's own run of no plan: a plan without decisions takes exactly this time.
        self.baseline_time_s = float(self._run_lowered(Lowered(level=PLAIN, decisions=()), NO_LIMIT,
                                                       False, False)[1][K.R_TIME])
        self._views: tuple = ((), self)  # the last conv decisions simulated and the simulator of their view

    @property
    def baseline_op_start_s(self) -> np.ndarray:
        """Start time of every op in the unconstrained run."""
        return self._prefix[:-1]

    def run(self, plan: Plan | None = None, budget_bytes: int = NO_LIMIT, timeline: bool = False) -> SimResult:
        """Simulate under `plan` with a cap of `budget_bytes` (NO_LIMIT: no cap), at the level it runs."""
        return self._simulate(plan, budget_bytes, timeline, emit=False)[0]

    def program_rows(self, plan: Plan | None, budget_bytes: int) -> tuple[SimResult, np.ndarray, dict, Lowered]:
        """Simulate and return the step program the simulation ran.

        Returns:
            (result, rows, chains, lowered): rows (op, after, action, decision) in execution order, as
            `memplan.sim._kernel` emits them, the recompute chain of every recompute decision, and the
            plan at the level it runs (rows and chains index its decisions).
        """
        return self._simulate(plan, budget_bytes, False, emit=True)

    def _simulate(self, plan, budget_bytes, timeline: bool, emit: bool):
        microbatches = plan.microbatches if plan else ()
        if microbatches:  # run op by op: the interpreted runner splits them (memplan.exec.microconv)
            result, rows, chains, lowered = self._view_of(microbatches)._simulate(
                replace(plan, microbatches=()), budget_bytes, timeline, emit)
            lowered = replace(lowered, level=INTERPRETED, reason=MICRO_BATCHES)
            return replace(result, level=INTERPRETED, level_reason=MICRO_BATCHES), rows, chains, lowered
        budget = int(budget_bytes)
        lowered = self.lower(plan.decisions if plan else ())
        out = self._run_lowered(lowered, budget, timeline, emit)
        if lowered.level == HOOKED or lowered.dropped:  # interpreted where its hooked form does not fit (or, with no cap, peaks higher)
            interpreted = Lowered(level=INTERPRETED, decisions=tuple(plan.decisions),
                                  reason=f"its hooked form does not fit ({lowered.reason or 'later hook points'})")
            if not out[2][K.I_FEASIBLE]:
                out, lowered = self._run_lowered(interpreted, budget, timeline, emit), interpreted
            elif not limited(budget):
                other = self._run_lowered(interpreted, budget, timeline, emit)
                if other[2][K.I_PEAK] < out[2][K.I_PEAK]:
                    out, lowered = other, replace(interpreted, reason="its hooked form peaks higher")
        arrays, floats, ints, recorded, rows, chains = out
        return self._result(arrays, floats, ints, recorded, timeline, lowered), rows, chains, lowered

    def hooked(self, plan: Plan, budget_bytes: int) -> SimResult | None:
        """The simulation of `plan`'s hooked form alone (None when it has none: memplan.sim.lowering)."""
        lowered = self.lower(plan.decisions)
        if lowered.level == INTERPRETED or plan.microbatches or not plan.decisions:
            return None
        budget = int(budget_bytes)
        arrays, floats, ints, recorded, _, _ = self._run_lowered(lowered, budget, False, False)
        return self._result(arrays, floats, ints, recorded, False, lowered)

    def lower(self, decisions) -> Lowered:
        """`decisions` at the level they would run (memplan.sim.lowering; before the budget's say)."""
        if self.lowering is None:
            return Lowered(level=PLAIN if not decisions else INTERPRETED, decisions=tuple(decisions),
                           reason="" if not decisions else "the trace has no ops to hook")
        return self.lowering.lower(decisions)

    def _run_lowered(self, lowered: Lowered, budget: int, timeline: bool, emit: bool):
        arrays, chains = self._plan_arrays(lowered)
        floats, ints, *recorded, rows = self._kernel.run_kernel(
            self._durations, self.trace.nbytes, *self._births, *self._deaths_for(lowered.holds), *arrays,
            budget, timeline, emit)
        return arrays, floats, ints, recorded, rows, chains

    def _deaths_for(self, holds: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
        key = tuple(sorted(holds.items()))
        if key not in self._deaths:
            if len(self._deaths) >= RECENT_CHAINS:
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

    def _view_of(self, microbatches) -> Simulator:
        """A simulator of the trace as the conv decisions make it; the last one is kept (search
        planners simulate many plans with the same conv decisions)."""
        key, sim = self._views
        if key != microbatches:
            view, durations = conv_view(self.trace, self._durations, microbatches)
            sim = Simulator(view, self.cost.carried(durations), self._kernel, hooks=False)
            sim.baseline_time_s = self.baseline_time_s
            self._views = (microbatches, sim)
        return sim

    # --- per-plan preparation ----------------------------------------------------------------

    def _plan_arrays(self, lowered: Lowered) -> tuple[tuple, dict]:
        """Flat per-decision arrays and per-op event lists for the kernel (vectorised), and the
        recompute chains by decision."""
        trace, cost, n = self.trace, self.cost, self.trace.num_steps
        decisions = lowered.decisions
        # One flat iterator: numpy converts it much faster than a list of tuples (search planners
        # prepare thousands of plans).
        fields = np.fromiter(itertools.chain.from_iterable(
            (d.storage, d.action == "recompute", d.out_after, d.back_before,
             NO_TRIGGER if d.trigger is None else d.trigger, d.sync + K.OVERLAP * d.overlap, d.compress_ratio or 0.0)
            for d in decisions), dtype=np.float64, count=7 * len(decisions)).reshape(-1, 7)
        sid, is_rec, out_after, back, trigger = (fields[:, j].astype(np.int64) for j in range(5))
        sync, ratio = fields[:, 5].astype(np.int64), fields[:, 6]  # sync: K.SYNC and K.OVERLAP bits
        trigger = np.where((trigger == NO_TRIGGER) | (is_rec == 1), back, trigger)  # = Decision.prefetch_at
        kind = np.where(is_rec == 1, K.RECOMPUTE, K.SWAP).astype(np.int64)
        swap = kind == K.SWAP
        nbytes = trace.nbytes[sid]
        link_bytes = np.where(swap, np.where(ratio > 0, np.round(nbytes * ratio), nbytes), 0).astype(np.int64)
        # Cost's copy and kernel times are affine in bytes, so they take arrays.
        d2h = np.where(swap, cost.d2h_s(link_bytes), 0.0)
        h2d = np.where(swap, cost.h2d_s(link_bytes), 0.0)
        comp = np.where(swap & (ratio > 0), cost.memory_pass_s(nbytes), 0.0)
        wraps = swap & (back <= out_after)
        wrap = np.where(wraps, np.where(trigger > out_after, K.TAIL_WRAP, K.HEAD_WRAP), K.NO_WRAP).astype(np.int64)
        absent = np.zeros(len(trace.storages), dtype=np.bool_)
        absent[sid[wrap == K.HEAD_WRAP]] = True
        chains = self._chains_for(lowered)
        chain, chain_alloc, chain_free, chain_host = self._chain_arrays(chains, len(kind), lowered.level)
        wait_first = self._wait_first(decisions, chains)
        ids = np.arange(len(sid))
        rank = np.where(swap, -1, self._producers[sid])
        host = self._host[lowered.level]
        if len(sid) and (cost.executor_s("action") or not cost.host_async):
            host = host.copy()  # actions: swap: out, release, prefetch, wait; recompute: drop, run
            acts = np.concatenate([out_after, back, out_after[swap], trigger[swap]])  # two per decision, four a swap
            np.add.at(host, acts, cost.executor_s("action"))
            if not cost.host_async:  # the CPU copies on its one thread (memplan.exec.engine), nothing beside
                np.add.at(host, out_after[swap], d2h[swap])
                np.add.at(host, trigger[swap], h2d[swap])
                d2h, h2d = np.zeros_like(d2h), np.zeros_like(h2d)
        return (kind, sid, sync, wrap, link_bytes, d2h, h2d, comp, chain, chain_alloc, chain_free, chain_host,
                *event_csr(trigger[swap], np.zeros(swap.sum(), dtype=np.int64), ids[swap], n),
                *event_csr(back, rank, ids, n),
                *event_csr(out_after, np.zeros(len(sid), dtype=np.int64), ids, n), absent, back,
                wait_first, host, cost.host_async), chains

    def _chains_for(self, lowered: Lowered) -> dict:
        """The recompute chains by decision: region runs of a hooked plan (memplan.sim.lowering), else
        op replays (memplan.sim.chains), reused for a plan with the same recompute decisions as a
        recent one (search planners vary the others too)."""
        decisions = lowered.decisions
        if lowered.level == HOOKED:
            return self.lowering.chains(lowered, self._producers) if lowered.regions else {}
        key = tuple((k, d.storage, d.out_after, d.back_before) for k, d in enumerate(decisions)
                    if d.action == "recompute")
        chains = self._recent_chains.get(key)
        if chains is None:
            chains = plan_chains(self.trace, decisions, self._durations, self._producers, self._chain_memo) \
                if key else {}
            if len(self._recent_chains) >= RECENT_CHAINS:
                self._recent_chains.clear()
            self._recent_chains[key] = chains
        return chains

    def _chain_arrays(self, chains: dict, n: int, level: str) -> tuple[np.ndarray, ...]:
        """Per decision: chain seconds, bytes allocated when it starts and freed when it is done, and
        the host's work to issue its ops (replayed through Python when interpreted)."""
        per_op = self.cost.host_op_s + (self.cost.executor_s("replay_op") if level == INTERPRETED else 0.0)
        per_run = self.cost.executor_s("region") if level == HOOKED else 0.0
        seconds, alloc, freed = np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        host = np.zeros(n)
        for k, chain in chains.items():
            seconds[k], alloc[k], freed[k] = chain.seconds, chain.alloc_bytes, chain.free_bytes
            host[k] = per_op * sum(len(step.ops) for step in chain.steps) + (per_run if chain.steps else 0.0)
        return seconds, alloc, freed, host

    @staticmethod
    def _wait_first(decisions, chains: dict) -> np.ndarray:
        """Swaps whose storage lands at an op where a recomputation reads it: they land first."""
        if not chains:
            return np.zeros(len(decisions), dtype=np.bool_)
        read_at: dict[int, set[int]] = {}
        for k, chain in chains.items():
            read_at.setdefault(decisions[k].back_before, set()).update(chain.inputs)
        return np.fromiter((d.action == "swap" and d.storage in read_at.get(d.back_before, ()) for d in decisions),
                           dtype=np.bool_, count=len(decisions))

    # --- results ---------------------------------------------------------------------------------

    def _result(self, arrays, floats, ints, recorded, timeline: bool, lowered: Lowered) -> SimResult:
        feasible = bool(ints[K.I_FEASIBLE])
        stalls = floats[K.R_MEM_STALL] + floats[K.R_PREFETCH_STALL] + floats[K.R_SYNC_STALL]
        breakdown = {
            "compute_s": float(floats[K.R_COMPUTE]),
            "memory_stall_s": float(floats[K.R_MEM_STALL]),
            "prefetch_stall_s": float(floats[K.R_PREFETCH_STALL]),
            "recompute_s": float(floats[K.R_RECOMPUTE]),
            "sync_stall_s": float(floats[K.R_SYNC_STALL]),
            "overlap_s": float(max(0.0, floats[K.R_COPY_BUSY] - stalls)),
            "host_s": float(floats[K.R_HOST]),
        }
        extra = {}
        if timeline and feasible:
            load_t, load_v, _, _, op_start, copies = recorded
            n_load = int(ints[K.I_N_LOAD_EVENTS])
            order = np.argsort(load_t[:n_load], kind="stable")  # lazily applied releases may lag
            extra = dict(timeline_t=load_t[:n_load][order], timeline_load=load_v[:n_load][order],
                         op_start_s=op_start.copy(), lanes=self._lanes(op_start, copies))
        return SimResult(
            feasible=feasible,
            time_s=float(floats[K.R_TIME]) if feasible else float("inf"),
            baseline_time_s=self.baseline_time_s,
            peak_load_bytes=int(ints[K.I_PEAK]),
            breakdown=breakdown,
            host_peak_bytes=host_peak(arrays, recorded, ints) if feasible else 0,
            link_bytes=int(ints[K.I_LINK]),
            infeasible_op=None if feasible else int(ints[K.I_BAD_OP]),
            shortfall_bytes=0 if feasible else int(ints[K.I_SHORTFALL]),
            level=lowered.level, dropped=lowered.dropped, level_reason=lowered.reason,
            **extra)

    def _lanes(self, op_start, copies) -> dict:
        """Busy intervals (start, end) of the compute stream and the two copy engines."""
        ends = op_start + self._durations
        compute = [(float(s), float(e)) for s, e in zip(op_start, ends) if e > s]
        compute += [(float(s), float(e)) for s, e, k in copies if k == K.EXTRA_WORK]
        lanes = {"compute": sorted(compute)}
        for name, kind in (("d2h", K.D2H_COPY), ("h2d", K.H2D_COPY)):
            lanes[name] = [(float(s), float(e)) for s, e, k in copies if k == kind]
        return lanes
