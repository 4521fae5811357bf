"""The discrete-event simulator every planner is judged by.

Semantics (the contract of DESIGN.md, "Simulator semantics"):

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

from ..budget import Budget, budget_given, budget_in_force
from ..cost.model import Cost
from ..cost.profiles import DeviceProfile, profile_from_json
from ..model import Plan, Trace, check_plan, expect_trace
from . import _codes as K
from .kernel import compiled
from .chains import plan_chains
from .convview import conv_view
from .memo import ProbeMemo
from .result import SimResult

NO_CAP_BYTES = np.iinfo(np.int64).max // 4  # the cap the kernel runs under without a budget
DEFAULT_DEVICE = "h100"  # the profile of a simulation given none, of a plan that records none
NO_TRIGGER = -1  # placeholder for Decision.trigger None while extracting fields
RECENT_CHAINS = 4096  # plans' recompute chains kept by their recompute decisions


def simulate(trace: Trace, plan: Plan | None = None, device: str | DeviceProfile | None = None,
             budget: Budget | str | int | float | None = None, cost: Cost | None = None,
             timeline: bool = False) -> SimResult:
    """Simulate one iteration of `trace` under `plan` and `budget`.

    Args:
        trace: the traced iteration.
        plan: the plan (checked to belong to `trace`); None keeps everything resident.
        device: profile name, file or DeviceProfile (ignored when `cost` is given); None: the
            profile the plan was made for, else DEFAULT_DEVICE.
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
    cost = cost or Cost.for_trace(trace, simulation_device(plan, device)[0])
    own = None if plan is None else plan.budget_bytes
    budget_bytes, source = budget_in_force(budget_given(budget), own, trace.peak_load_bytes)
    result = Simulator(trace, cost).run(plan, budget_bytes, timeline=timeline)
    return replace(result, budget_bytes=budget_bytes, budget_source=source)


def simulation_device(plan: Plan | None, device: str | DeviceProfile | None) -> tuple[str | DeviceProfile, str]:
    """(profile, where it came from: "given", "plan" or "default") for `simulate`: `device`,
    else the profile the plan was made for, else DEFAULT_DEVICE.

    Raises:
        MemplanError: the plan's recorded profile is damaged.
    """
    if device is not None:
        return device, "given"
    if plan is not None and plan.device:
        return profile_from_json(plan.device, "the plan's device profile"), "plan"
    return DEFAULT_DEVICE, "default"


class Simulator:
    """A simulator bound to one trace and cost model: per-trace arrays are built once.

    Search planners create one and call `run` thousands of times.
    """

    def __init__(self, trace: Trace, cost: Cost, kernel: ModuleType | None = None):
        self.trace = trace
        self.cost = cost
        self._kernel = kernel or compiled()  # memplan.sim.kernel: compiled, or interpreted for one run
        n = trace.num_steps
        alive = trace.free_ops > trace.alloc_ops
        ids = np.arange(len(trace.storages))
        self._birth_ptr, self._birth_ids = _csr(trace.alloc_ops[alive], ids[alive], n)
        self._death_ptr, self._death_ids = _csr(trace.free_ops[alive] - 1, ids[alive], n)
        # A pool-only trace (no ops) runs its time axis as steps that take no time.
        self._durations = np.zeros(n) if not trace.ops else np.ascontiguousarray(cost.durations, dtype=np.float64)
        self._prefix = np.concatenate([[0.0], np.cumsum(self._durations)])
        # Recomputes at one op run in producer order, so a chain finds its inputs rebuilt.
        self._producers = np.array([-1 if trace.producer(s) is None else trace.producer(s)
                                    for s in range(len(trace.storages))], dtype=np.int64)
        # Chains of plans that differ in a few decisions are mostly the same (memplan.sim.memo).
        self._chain_memo = ProbeMemo()
        self._recent_chains: dict[tuple, dict] = {}
        # Sequential sum, exactly as the kernel accumulates time: no plan gives time == baseline.
        self.baseline_time_s = float(self._prefix[-1])
        self._views: tuple = ((), self)  # the last conv decisions simulated and the simulator of their view

    @property
    def baseline_op_start_s(self) -> np.ndarray:
        """Start time of every op in the unconstrained run."""
        return self._prefix[:-1]

    def run(self, plan: Plan | None = None, budget_bytes: int | None = None, timeline: bool = False) -> SimResult:
        """Simulate under `plan` with a cap of `budget_bytes` (None: no cap)."""
        return self._simulate(plan, budget_bytes, timeline, emit=False)[0]

    def program_rows(self, plan: Plan | None, budget_bytes: int | None) -> tuple[SimResult, np.ndarray, dict]:
        """Simulate and return the step program the simulation ran.

        Returns:
            (result, rows, chains): rows (op, after, action, decision) in execution order, as
            `memplan.sim._kernel` emits them, and the recompute chain of every recompute decision.
        """
        result, rows, chains = self._simulate(plan, budget_bytes, False, emit=True)
        return result, rows, chains

    def _simulate(self, plan, budget_bytes, timeline: bool, emit: bool):
        microbatches = plan.microbatches if plan else ()
        if microbatches:
            return self._view_of(microbatches)._simulate(replace(plan, microbatches=()), budget_bytes, timeline, emit)
        decisions = plan.decisions if plan else ()
        arrays, chains = self._plan_arrays(decisions)
        budget = NO_CAP_BYTES if budget_bytes is None else int(budget_bytes)
        floats, ints, *recorded, rows = self._kernel.run_kernel(
            self._durations, self.trace.nbytes, self._birth_ptr, self._birth_ids, self._death_ptr,
            self._death_ids, *arrays, budget, timeline, emit)
        return self._result(arrays, floats, ints, recorded, timeline), rows, chains

    def _view_of(self, microbatches) -> Simulator:
        """A simulator of the trace as the conv decisions make it; the last one is kept (search
        planners simulate many plans with the same conv decisions)."""
        key, sim = self._views
        if key != microbatches:
            view, durations = conv_view(self.trace, self._durations, microbatches)
            sim = Simulator(view, Cost(profile=self.cost.profile, durations=durations), self._kernel)
            sim.baseline_time_s = self.baseline_time_s
            self._views = (microbatches, sim)
        return sim

    # --- per-plan preparation ----------------------------------------------------------------

    def _plan_arrays(self, decisions) -> tuple[tuple, dict]:
        """Flat per-decision arrays and per-op event lists for the kernel (vectorised), and the
        recompute chains by decision."""
        trace, cost, n = self.trace, self.cost, self.trace.num_steps
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
        chain, chain_alloc, chain_free, chains = self._chains_for(decisions, kind)
        wait_first = self._wait_first(decisions, chains)
        ids = np.arange(len(sid))
        rank = np.where(swap, -1, self._producers[sid])
        return (kind, sid, sync, wrap, link_bytes, d2h, h2d, comp, chain, chain_alloc, chain_free,
                *_event_csr(trigger[swap], np.zeros(swap.sum(), dtype=np.int64), ids[swap], n),
                *_event_csr(back, rank, ids, n),
                *_event_csr(out_after, np.zeros(len(sid), dtype=np.int64), ids, n), absent, back,
                wait_first), chains

    def _chains_for(self, decisions, kind) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
        """Per decision: chain seconds, bytes allocated when it starts and freed when it is done;
        and the chains of the recompute decisions (memplan.sim.chains), reused for a plan with the
        same recompute decisions as a recent one (search planners vary the others too)."""
        key = tuple((k, d.storage, d.out_after, d.back_before) for k, d in enumerate(decisions)
                    if d.action == "recompute")
        chains = self._recent_chains.get(key)
        if chains is None:
            chains = plan_chains(self.trace, decisions, self._durations, self._producers, self._chain_memo) \
                if key else {}
            if len(self._recent_chains) >= RECENT_CHAINS:
                self._recent_chains.clear()
            self._recent_chains[key] = chains
        n = len(kind)
        seconds, alloc, freed = np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        for k, chain in chains.items():
            seconds[k], alloc[k], freed[k] = chain.seconds, chain.alloc_bytes, chain.free_bytes
        return seconds, alloc, freed, chains

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

    def _result(self, arrays, floats, ints, recorded, timeline: bool) -> SimResult:
        feasible = bool(ints[K.I_FEASIBLE])
        stalls = floats[K.R_MEM_STALL] + floats[K.R_PREFETCH_STALL] + floats[K.R_SYNC_STALL]
        breakdown = {
            "compute_s": float(floats[K.R_COMPUTE]),
            "memory_stall_s": float(floats[K.R_MEM_STALL]),
            "prefetch_stall_s": float(floats[K.R_PREFETCH_STALL]),
            "recompute_s": float(floats[K.R_RECOMPUTE]),
            "sync_stall_s": float(floats[K.R_SYNC_STALL]),
            "overlap_s": float(max(0.0, floats[K.R_COPY_BUSY] - stalls)),
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
            host_peak_bytes=_host_peak(arrays, recorded, ints) if feasible else 0,
            link_bytes=int(ints[K.I_LINK]),
            infeasible_op=None if feasible else int(ints[K.I_BAD_OP]),
            shortfall_bytes=0 if feasible else int(ints[K.I_SHORTFALL]),
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


def _host_peak(arrays, recorded, ints) -> int:
    """Largest pinned host memory held at once (needs the recorded host events)."""
    wrap, link_bytes = arrays[3], arrays[4]
    host_t, host_v = recorded[2], recorded[3]
    n_host = int(ints[K.I_N_HOST_EVENTS])
    start = int(link_bytes[wrap == K.HEAD_WRAP].sum())
    if n_host == 0:
        return start if link_bytes.size else 0
    # At equal times releases go first: a prefetch that lands frees its host copy for a
    # swap-out starting at that instant.
    order = np.lexsort((host_v[:n_host], host_t[:n_host]))
    return int(max(start, start + np.cumsum(host_v[:n_host][order]).max()))


def _csr(keys: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Group `values` by integer `keys` in [0, n) as (ptr, ids)."""
    order = np.argsort(keys, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.add.at(ptr, keys + 1, 1)
    return np.cumsum(ptr), np.ascontiguousarray(values[order], dtype=np.int64)


def _event_csr(ops: np.ndarray, rank: np.ndarray, ids: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Decision `ids` grouped by op as a CSR, ordered by (op, rank, id) within the list."""
    order = np.lexsort((ids, rank, ops))
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.add.at(ptr, ops + 1, 1)
    return np.cumsum(ptr), np.ascontiguousarray(ids[order], dtype=np.int64)
