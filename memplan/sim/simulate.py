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
  A swap-out after the last op (wrap-around, asynchronous, uncompressed) is carried over: the
  step starts with it still copying out, FIFO from the step's start, its bytes held until it is
  released in the step (its copy done, or waited for by an allocation or by its own prefetch).
  Any other swap-out still copying when the last op ends is released at the step's end, where the
  compute stream waits for it (sync_stall_s; memplan.exec.engine, rule 5), and so is every one of a
  step replayed as a CUDA graph (`Cost.captured`), which joins its copies at its end.
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
- The iteration ends when the compute stream finishes (its wait for the swap-outs released at the
  step's end included), plus, in steady state, the wait the
  next iteration (taken to repeat this one) would have for wrap-around copies: a tail
  prefetch landing after its op's start there, or a head prefetch there delayed by this
  iteration's swap-out or host-to-device queue beyond its slack. The largest such lateness is
  charged once, as prefetch_stall_s. overlap_s is the copy time hidden behind compute (copy
  busy time minus the stalls, at least 0).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from functools import cached_property
from types import SimpleNamespace

import numpy as np

from ..budget import NO_LIMIT, limited
from ..cost.model import Cost
from ..model import Plan, Trace
from ..model.hooksites import without_updates
from ..problem import Problem
from . import _codes as K
from .kernel_loader import compiled
from .arrays import host_peak
from .convview import conv_view
from .levels import Level, Prepared
from .lowering import HOOKED, INTERPRETED, Lowered, Lowering
from .prepare import KernelInputs, Preparer
from .result import SimResult

RECENT_PLANS = 8  # prepared plans kept (a bisection over caps simulates one plan many times)
MICRO_BATCHES = "micro-batched convolutions run op by op"  # why such a plan is interpreted


def simulator_of(problem: Problem, hooks: bool = True) -> Simulator:
    """The problem's simulator (made once for its trace and cost; `hooks` false: one that runs every plan
    interpreted): a plan prepared by the planner is not prepared again by the step program's compiler."""
    return problem.made_once(("simulator", bool(hooks)), lambda: Simulator(problem.trace, problem.cost, hooks=hooks))


class Simulator:
    """A simulator bound to one trace and cost model: per-trace arrays are built once.

    Search planners create one and call `run` thousands of times. A plan is prepared once (its
    columns, its lowering, the kernel's arrays at each level it runs at) and kept while it is one
    of the last RECENT_PLANS simulated, so simulating it again (at another budget: a bisection
    over caps) only runs the kernel.
    """

    def __init__(self, trace: Trace, cost: Cost, kernel: SimpleNamespace | None = None, hooks: bool = True):
        self.trace = trace
        self.cost = cost
        self._kernel = kernel or compiled()  # memplan.sim.kernel_loader: compiled, or interpreted for one run
        # A pool-only trace (no ops) runs its time axis as steps that take no time.
        n = trace.num_steps
        self._durations = np.zeros(n) if not trace.ops else np.ascontiguousarray(cost.durations, dtype=np.float64)
        self._prefix = np.concatenate([[0.0], np.cumsum(self._durations)])
        self.lowering = Lowering(trace, self._durations, self._kernel.place_decisions) if hooks and trace.ops else None
        self._prepare = Preparer(trace, cost, self._durations, self.lowering, self._kernel)
        self._plans: OrderedDict[int, Prepared] = OrderedDict()  # by id of the decisions tuple
        self.evaluations = 0  # plans evaluated (simulated, or found not to fit without simulating)
        # The kernel's own run of no plan: a plan without decisions takes exactly this time.
        self.baseline_time_s = float(self._run_inputs(self._prepared(()).first.inputs, NO_LIMIT, False, False)[1][K.R_TIME])
        self._views: tuple = ((), self)  # the last conv decisions simulated and the simulator of their view

    @cached_property
    def whole_step_lowering(self) -> Lowering:
        """The lowering of the trace without the hooks inside the optimizer's step (its update marks)."""
        return Lowering(without_updates(self.trace), self._durations, self._kernel.place_decisions, whole_step=True)

    @property
    def baseline_op_start_s(self) -> np.ndarray:
        """Start time of every op in the unconstrained run."""
        return self._prefix[:-1]

    def run(self, plan: Plan | None = None, budget_bytes: int = NO_LIMIT, timeline: bool = False) -> SimResult:
        """Simulate under `plan` with a cap of `budget_bytes` (NO_LIMIT: no cap), at the level it runs."""
        return self._simulate(plan, budget_bytes, timeline, emit=False)[0]

    def time_if_fits(self, plan: Plan, budget_bytes: int) -> float | None:
        """The simulated step time of `plan` under `budget_bytes` at the level it runs (`run`), or None
        where it does not fit: what a search compares. Where a lower bound of its peak at that level
        exceeds the budget, nothing is simulated."""
        if plan.microbatches:
            result = self.run(plan, budget_bytes)
            return result.time_s if result.feasible else None
        self.evaluations += 1
        entry = self._prepared(plan.decisions)
        if entry.cannot_fit(int(budget_bytes), plan.level):
            return None
        _, out = self._at_its_level(entry, plan.level, int(budget_bytes), False, False, probe=True)  # as `run`
        if out is None:  # its interpreted form's floor exceeds the budget: not simulated
            return None
        floats, ints = out[1], out[2]
        return float(floats[K.R_TIME]) if ints[K.I_FEASIBLE] else None

    def overhead_if_fits(self, plan: Plan, budget_bytes: int) -> float | None:
        """`time_if_fits` as an overhead against the unconstrained run (SimResult.overhead)."""
        time_s = self.time_if_fits(plan, budget_bytes)
        if time_s is None:
            return None
        return time_s / self.baseline_time_s - 1.0 if self.baseline_time_s > 0 else 0.0

    def peak_floor(self, plan: Plan) -> int:
        """A lower bound of `plan`'s peak as planned, whatever its timing: every storage alive at an op and
        outside its decisions' gaps is resident there (memplan.sim._events.floor_load). What a search that
        scores a plan over the budget by how far over it is reads (`time_if_fits` has prepared it)."""
        return self._prepared(plan.decisions).interpreted_floor

    def program_rows(self, plan: Plan | None, budget_bytes: int) -> tuple[SimResult, np.ndarray, dict, Lowered]:
        """Simulate and return the step program the simulation ran.

        Returns:
            (result, rows, chains, lowered): rows (op, after, action, decision) in execution order, as
            `memplan.sim._kernel` emits them, the recompute chain of every recompute decision, and the
            plan at the level it runs (rows and chains index its decisions).
        """
        result, rows, lowered = self._simulate(plan, budget_bytes, False, emit=True)
        return result, rows, self._prepare.chains(lowered), lowered

    def _simulate(self, plan, budget_bytes, timeline: bool, emit: bool):
        self.evaluations += 1
        microbatches = plan.microbatches if plan else ()
        if microbatches:  # run op by op: the interpreted runner splits them (memplan.exec.microconv)
            result, rows, lowered = self._view_of(microbatches)._simulate(
                replace(plan, microbatches=()), budget_bytes, timeline, emit)
            lowered = replace(lowered, level=INTERPRETED, reason=MICRO_BATCHES)
            return replace(result, level=INTERPRETED, level_reason=MICRO_BATCHES), rows, lowered
        level, out = self._at_its_level(self._prepared(plan.decisions if plan else ()), plan.level if plan else "",
                                        int(budget_bytes), timeline, emit)
        inputs, floats, ints, recorded, rows = out
        lowered = level().lowered
        return self._result(inputs, floats, ints, recorded, timeline, lowered), rows, lowered

    def _at_its_level(self, entry: Prepared, chosen: str, budget: int, timeline: bool, emit: bool,
                      probe: bool = False):
        """The level `entry` runs at under `budget`, and the kernel's run of it: the plan's own (`Plan.level`,
        recorded when it was planned), or for a plan without one, hooked where its hooked form fits, else
        interpreted (with no cap, whichever peaks lower). The level comes as a function: an interpreted one's
        reason may need the hooked form, which a search's question (`time_if_fits`) does not. With `probe`
        (that question), the run is None where it is interpreted and its replays' floor exceeds the budget."""
        if chosen == INTERPRETED and entry.given is None:  # its planner chose the interpreted executor
            return (lambda: entry.chosen), self._interpreted_run(entry, budget, timeline, emit, probe)
        if chosen:  # the level is known: only that form runs
            level = entry.first
            return self._fewest_splits(entry, level, self._run_inputs(level.inputs, budget, timeline, emit), budget,
                                       timeline, emit)
        if entry.hooked_cannot_fit(budget):
            return (lambda: entry.interpreted), self._interpreted_run(entry, budget, timeline, emit, probe)
        level = entry.first
        out = self._run_inputs(level.inputs, budget, timeline, emit)
        if level.lowered.level != HOOKED and not level.lowered.dropped:
            return (lambda: level), out
        if not out[2][K.I_FEASIBLE]:
            return (lambda: entry.interpreted), self._interpreted_run(entry, budget, timeline, emit, probe)
        if not limited(budget):
            other = self._run_inputs(entry.interpreted_inputs, budget, timeline, emit)
            if other[2][K.I_PEAK] < out[2][K.I_PEAK]:
                return (lambda: Level(lowered=replace(entry.interpreted.lowered, reason="its hooked form peaks higher"),
                                      inputs=entry.interpreted_inputs)), other
        return self._fewest_splits(entry, level, out, budget, timeline, emit)

    def _interpreted_run(self, entry: Prepared, budget: int, timeline: bool, emit: bool, probe: bool):
        """The kernel's run of `entry`'s interpreted form, or with `probe`, None where its replays' floor
        exceeds `budget` (then the kernel would find it infeasible: `Prepared.replayed_floor`)."""
        if probe and limited(budget) and entry.replayed_floor > budget:
            return None
        return self._run_inputs(entry.interpreted_inputs, budget, timeline, emit)

    def _fewest_splits(self, entry: Prepared, level: Level, out, budget: int, timeline: bool, emit: bool):
        """`level`, a form of `entry` and its kernel run `out`, or where it splits the optimizer's step and
        the hooked form that runs the step whole fits `budget` no slower, that one (each split costs a
        stretch of the step: memplan.tracing.stepwise)."""
        whole = entry.whole if level.lowered.level == HOOKED and out[2][K.I_FEASIBLE] else None
        if whole is not None:
            other = self._run_inputs(whole.inputs, budget, timeline, emit)
            if other[2][K.I_FEASIBLE] and other[1][K.R_TIME] <= out[1][K.R_TIME]:
                return (lambda: whole), other
        return (lambda: level), out

    def hooked(self, plan: Plan, budget_bytes: int) -> SimResult | None:
        """The simulation of `plan`'s hooked form alone, as the executor runs it: the optimizer's step
        run whole where that fits no slower (None when it has none: memplan.sim.lowering)."""
        if plan.microbatches or not plan.decisions:
            return None
        entry = self._prepared(plan.decisions)
        if entry.first.lowered.level == INTERPRETED:
            return None
        budget = int(budget_bytes)
        level, out = self._fewest_splits(entry, entry.first, self._run_inputs(entry.first.inputs, budget, False, False),
                                         budget, False, False)
        inputs, floats, ints, recorded, _ = out
        return self._result(inputs, floats, ints, recorded, False, level().lowered)

    def lower(self, decisions) -> Lowered:
        """`decisions` at the level they run (memplan.sim.lowering)."""
        return self._prepared(tuple(decisions)).lowered

    def _prepared(self, decisions: tuple) -> Prepared:
        """`decisions` prepared (kept by identity among the last RECENT_PLANS)."""
        entry = self._plans.get(id(decisions))
        if entry is not None and entry.decisions is decisions:
            self._plans.move_to_end(id(decisions))
        else:
            entry = Prepared(decisions, self)
            self._plans[id(decisions)] = entry
            if len(self._plans) > RECENT_PLANS:
                self._plans.popitem(last=False)
        return entry

    def _run_inputs(self, inputs: KernelInputs, budget: int, timeline: bool, emit: bool):
        floats, ints, *recorded, rows = self._kernel.run_kernel(*inputs.args, budget, timeline, emit)
        return inputs, floats, ints, recorded, rows

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

    # --- results ---------------------------------------------------------------------------------

    def _result(self, inputs: KernelInputs, floats, ints, recorded, timeline: bool, lowered: Lowered) -> SimResult:
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
            host_peak_bytes=host_peak(inputs.wrap, inputs.link_bytes, recorded, ints) if feasible else 0,
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
