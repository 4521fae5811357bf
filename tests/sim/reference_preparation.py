"""The simulator's preparation of a plan as it was stated Decision by Decision (before it was vectorised).

A plain restatement, for tests, of what the simulator does to a plan before its kernel runs:
lowering onto hook points (memplan.sim.lowering's docstring), the choice of a region run for each
recompute decision (memplan.sim.regions' docstring), the level a plan runs at under a budget
(memplan.sim.simulate: its own where it was planned, else hooked where its hooked form fits),
and the kernel's arrays, built here with Python loops over the decisions. Facts of the trace alone
come from the library (its sites and their points, which storages an owner holds, the reason text
of a decision no site runs, and which hooks a set of points needs and what they fire:
`HookSites`; a call's candidates, inputs and run cost: `Regions._candidates`, `_inputs`, `_run`,
`run_ops`; replay chains: `plan_chains`); every rule that reads the plan is restated here. The
compiled kernel then runs these arrays, so a test that compares `Simulator.run` with
`reference_run` compares the fast preparation with this one.

Plans must decide each storage at most once (two equal decisions of one storage were numbered
differently before).
"""

from __future__ import annotations

import bisect
from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from memplan.budget import limited
from memplan.model.hookpoints import first_packs
from memplan.model.hooksites import HookSites, without_updates
from memplan.sim import _codes as K
from memplan.sim.arrays import csr, host_peak, host_per_op
from memplan.sim.chains import Chain, plan_chains
from memplan.sim.kernel_loader import compiled

HOOKED, INTERPRETED, PLAIN = "hooked", "interpreted", "plain"


class ReferenceLowering:
    """The hooked form of plans of one trace, Decision by Decision."""

    def __init__(self, sim):
        self.trace, self.lowering = sim.trace, sim.lowering
        self.regions = sim.lowering.regions if sim.lowering else None
        self.sites = HookSites(self.trace)
        self.points = self.sites.points
        self.first_pack = first_packs(self.trace.saved)

    def after(self, point):
        return self.points[bisect.bisect_left(self.points, point)]

    def before(self, point):
        return self.points[bisect.bisect_right(self.points, point) - 1]

    def lower(self, decisions):
        """(level, decisions, regions, holds, dropped, reason)."""
        trace = self.trace
        if not decisions:
            return PLAIN, (), {}, {}, 0, ""
        if self.regions is None:
            return INTERPRETED, decisions, {}, {}, 0, "the trace has no ops to hook"
        if not trace.saved:
            return INTERPRETED, decisions, {}, {}, 0, \
                "the trace has no saved-tensor records (traced before memplan recorded them)"
        if trace.engine_owned and any(d.action == "recompute" for d in decisions):
            return INTERPRETED, decisions, {}, {}, 0, \
                "a data-parallel engine's module calls do not run again alone: replayed op by op"
        unhookable = [self.unhookable(d) for d in decisions]
        moved = [m for m, out in zip(map(self.moved, decisions), unhookable) if m is not None and not out]
        runs = self.runs(moved)
        kept = [d for k, d in enumerate(moved) if k in runs or d.action == "swap"]
        regions = {kept.index(moved[k]): run for k, run in runs.items()}
        unmade = [k for k, d in enumerate(moved) if d.action == "recompute" and k not in runs]
        first = next((d for d, out in zip(decisions, unhookable) if out), None)  # its reason in the library's words
        why = (self.sites.reason(first) if first is not None else "") or (
            f"no module call can recompute storage {moved[unmade[0]].storage}" if unmade else "")
        if not kept:
            return PLAIN, (), {}, {}, len(decisions), why
        return HOOKED, tuple(kept), regions, self.holds(kept, regions), len(decisions) - len(kept), why

    def unhookable(self, d):
        """True when `d` cannot run at hook points: it is no swap of a storage an owner holds, and it is no tensor autograd
        saves, or it is away until an op outside backward (or across the boundary), or it leaves before its
        first pack."""
        if d.action == "swap" and any(o.storage == d.storage for o in self.trace.owners):
            return False
        first = self.first_pack.get(d.storage)
        return first is None or d.wraps or self.trace.ops[d.back_before].phase != "backward" or \
            self.trace.saved[first].packed_at > self.after(d.out_after + 1)

    def moved(self, d):
        out = self.after(d.out_after + 1) - 1
        if d.action == "recompute":
            back = self.before(d.back_before)
            return replace(d, out_after=out, back_before=back) if back > out + 1 else None
        if not d.wraps:
            if out + 1 >= d.back_before:
                return None
            return replace(d, out_after=out, trigger=max(self.before(d.prefetch_at), out + 1), overlap=False)
        if d.prefetch_at > d.out_after:  # prefetched in the tail: at the step's end means the next one's start
            trigger = max(self.before(d.prefetch_at), out + 1)
            return replace(d, out_after=out, trigger=trigger if trigger < len(self.trace.ops) else 0, overlap=False)
        return replace(d, out_after=out, trigger=self.before(d.prefetch_at), overlap=False)

    def host(self, plain, cost, decisions, regions):
        """The host's work per op of a hooked program: plain training's, plus a hook's price per firing of the
        hooks its points need and a stretch's per split of the optimizer's step (which, and where they fire,
        is the library's `HookSites`)."""
        if not cost.executor_s("hook_call"):
            return plain.copy()
        sites = self.installed(decisions, regions)
        return plain + cost.executor_s("hook_call") * self.sites.firings(sites) + \
            cost.executor_s("stretch") * self.sites.stretches(sites)

    def installed(self, decisions, regions):
        """The sites the hooked program of `decisions` (lowered) needs."""
        points = [p for d in decisions for p in (d.out_after + 1, d.prefetch_at, self.before(d.back_before))]
        return self.sites.installed(points, {d.storage for d in decisions}, {run.call for run in regions.values()})

    def runs(self, decisions):
        """The region run of each recompute decision some call can run (by index)."""
        trace, regions = self.trace, self.regions
        out = {}
        for at in sorted({d.back_before for d in decisions if d.action == "recompute"}):
            members = [k for k, d in enumerate(decisions) if d.action == "recompute" and d.back_before == at]
            valid = {}
            for k in members:
                calls = [c for c, stop in regions._candidates(decisions[k].storage, at)
                         if all(self.resident_or_argument(r, c, at, decisions) for r in regions._inputs(c, stop))]
                if calls:
                    valid[k] = calls
            chosen = self.fewest_ops(valid, {k: decisions[k].storage for k in valid})
            for call in dict.fromkeys(chosen.values()):
                ks = [k for k in valid if chosen[k] == call]
                captures = tuple(sorted((self.first_pack[decisions[k].storage], decisions[k].storage) for k in ks))
                run = regions._run(call, captures).run
                out.update((k, run) for k in ks)
        return out

    def resident_or_argument(self, r, c, at, decisions):
        s = self.trace.storages[r]
        present = s.alloc_op <= at < s.free_op or r in self.trace.calls[c].args
        return present and not any(d.storage == r and d.out_after < at < d.back_before for d in decisions)

    def fewest_ops(self, valid, storage):
        """Each decision's smallest call, a larger call taking over where its one run takes fewer ops."""
        calls = self.trace.calls

        def cost(assigned):
            by_call = {}
            for k, c in assigned.items():
                by_call.setdefault(c, []).append(storage[k])
            return sum(self.regions.run_ops(c, sids) for c, sids in by_call.items())

        chosen = {k: cs[0] for k, cs in valid.items()}
        for c in sorted({c for cs in valid.values() for c in cs}, key=lambda c: calls[c].end_op - calls[c].first_op):
            trial = {k: (c if c in valid[k] else chosen[k]) for k in valid}
            if cost(trial) < cost(chosen):
                chosen = trial
        return chosen

    def holds(self, decisions, regions):
        last = {}
        for k, run in regions.items():
            last[run.call] = max(last.get(run.call, 0), decisions[k].back_before)
        out = {}
        for c, at in last.items():
            for a in self.trace.calls[c].args:
                s = self.trace.storages[a]
                if not s.persistent and s.free_op <= at:
                    out[a] = max(out.get(a, 0), at + 1)
        return out

    def chains(self, decisions, regions, producers):
        """Per recompute decision of a hooked plan: its run's chain for the first at its op in producer
        order, an empty (adopted) one for the others."""
        out = {}
        seen = set()
        for k in sorted(regions, key=lambda k: (decisions[k].back_before, producers[decisions[k].storage], k)):
            run = regions[k]
            if (run, decisions[k].back_before) in seen:
                out[k] = Chain(steps=(), adopted=(), seconds=0.0, alloc_bytes=0, transient_bytes=0)
                continue
            seen.add((run, decisions[k].back_before))
            out[k] = self.regions._run(run.call, run.captures).chain
        return out


def kernel_arrays(sim, level, decisions, chains, holds, host):
    """The kernel's arguments for `decisions` at `level`, decision by decision (`host`: the host's work per
    op before the actions)."""
    trace, cost, n = sim.trace, sim.cost, sim.trace.num_steps
    producers = np.array([-1 if trace.producer(s) is None else trace.producer(s) for s in range(len(trace.storages))])
    count = len(decisions)
    cols = {name: [] for name in ("kind", "sid", "sync", "wrap", "link", "d2h", "h2d", "comp")}
    host = host.copy()
    action = cost.executor_s("action")
    absent = np.zeros(len(trace.storages), dtype=np.bool_)
    issue, need, outs = [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)]
    for k, d in enumerate(decisions):
        swap = d.action == "swap"
        nbytes = int(trace.nbytes[d.storage])
        link = (nbytes if d.compress_ratio is None else int(np.round(nbytes * d.compress_ratio))) if swap else 0
        wrap = K.NO_WRAP if not (swap and d.wraps) else (K.TAIL_WRAP if d.prefetch_at > d.out_after else K.HEAD_WRAP)
        if wrap == K.HEAD_WRAP:
            absent[d.storage] = True
        for name, value in zip(cols, (K.SWAP if swap else K.RECOMPUTE, d.storage, d.sync + K.OVERLAP * d.overlap, wrap,
                                      link, cost.d2h_s(link) if swap else 0.0, cost.h2d_s(link) if swap else 0.0,
                                      cost.memory_pass_s(nbytes) if swap and d.compress_ratio else 0.0)):
            cols[name].append(value)
        if swap:
            issue[d.prefetch_at].append(k)
        need[d.back_before].append((-1 if swap else producers[d.storage], k))
        outs[d.out_after].append(k)
    if count and (action or not cost.host_async):  # actions: out and back each, and two more a swap
        for point in ([d.out_after for d in decisions] + [d.back_before for d in decisions]
                      + [d.out_after for d in decisions if d.action == "swap"]
                      + [d.prefetch_at for d in decisions if d.action == "swap"]):
            host[point] += action
        if not cost.host_async:  # the CPU copies itself
            for k, d in enumerate(decisions):
                if d.action == "swap":
                    host[d.out_after] += cols["d2h"][k]
            for k, d in enumerate(decisions):
                if d.action == "swap":
                    host[d.prefetch_at] += cols["h2d"][k]
            cols["d2h"], cols["h2d"] = [0.0] * count, [0.0] * count
    chain_cols = _chain_columns(cost, level, chains, count)
    read_at = {}
    for k, chain in chains.items():
        read_at.setdefault(decisions[k].back_before, set()).update(chain.inputs)
    wait_first = [d.action == "swap" and d.storage in read_at.get(d.back_before, ()) for d in decisions]
    lives = trace.free_ops > trace.alloc_ops
    free = trace.free_ops.copy()
    for sid, until in holds.items():
        free[sid] = max(free[sid], min(until, n))
    dies = free > trace.alloc_ops
    ints = {"kind", "sid", "sync", "wrap", "link"}
    return (sim._durations, trace.nbytes, *csr(trace.alloc_ops[lives], np.arange(len(trace.storages))[lives], n),
            *csr(free[dies] - 1, np.arange(len(trace.storages))[dies], n),
            *(np.array(v, dtype=np.int64 if name in ints else np.float64) for name, v in cols.items()),
            *chain_cols, *_lists(issue, n), *_lists([[k for _, k in sorted(ks)] for ks in need], n), *_lists(outs, n),
            absent, np.array([d.back_before for d in decisions], dtype=np.int64), np.array(wait_first, dtype=np.bool_),
            host, cost.host_async, not cost.captured)


def _chain_columns(cost, level, chains, count):
    per_op = cost.host_op_s + (cost.executor_s("replay_op") if level == INTERPRETED else 0.0)
    per_run = cost.executor_s("region") if level == HOOKED else 0.0
    seconds, alloc, free, host = np.zeros(count), np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64), \
        np.zeros(count)
    for k, chain in chains.items():
        seconds[k], alloc[k], free[k] = chain.seconds, chain.alloc_bytes, chain.free_bytes
        host[k] = per_op * sum(len(step.ops) for step in chain.steps) + (per_run if chain.steps else 0.0)
    return seconds, alloc, free, host


def _lists(lists, n):
    ptr = np.zeros(n + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(x) for x in lists])
    return ptr, np.array([k for x in lists for k in x], dtype=np.int64)


def guarded(plain, cost, decisions, chains):
    """`plain` plus the guard's price at each op some decision's storage is away at (after its out_after,
    before its back_before; across the step's boundary where its gap wraps), decision by decision, and the
    recording's price at each op a chain replays."""
    host = np.array(plain, dtype=np.float64)
    guard = cost.executor_s("guard_op")
    for op in range(len(host)):
        if any((d.out_after < op < d.back_before) if d.back_before > d.out_after else
               (op > d.out_after or op < d.back_before) for d in decisions):
            host[op] += guard
    for op in {j for chain in chains.values() for step in chain.steps for j in step.ops}:
        host[op] += cost.executor_s("record_op")
    return host


def reference_run(sim, plan, budget, hooked_only=False):
    """(level, dropped, reason, floats, ints, host peak) of `plan` under `budget`, prepared here (with
    `hooked_only`, of its hooked form alone: None where it has none)."""
    lowering = ReferenceLowering(sim)
    producers = np.array([-1 if sim.trace.producer(s) is None else sim.trace.producer(s)
                          for s in range(len(sim.trace.storages))])
    decisions = tuple(plan.decisions)
    level, lowered, regions, holds, dropped, reason = lowering.lower(decisions)

    def run(level, decisions, regions, holds, lowering=lowering):
        chains = lowering.chains(decisions, regions, producers) if level == HOOKED else (
            plan_chains(sim.trace, decisions, sim._durations, producers) if level == INTERPRETED else {})
        plain = host_per_op(sim.trace, sim.cost)[level]
        host = lowering.host(plain, sim.cost, decisions, regions) if level == HOOKED else (
            guarded(plain, sim.cost, decisions, chains) if level == INTERPRETED else plain)
        args = kernel_arrays(sim, level, decisions, chains, holds, host)
        floats, ints, *recorded, _ = compiled().run_kernel(*args, budget, False, False)
        peak = host_peak(args[9], args[10], recorded, ints) if ints[K.I_FEASIBLE] else 0
        return floats, ints, peak

    if hooked_only and (level == INTERPRETED or not decisions):
        return None
    if hooked_only:
        return _fewest_splits(sim, lowering, decisions, level, lowered, regions, holds, dropped, reason, run)
    if plan.level == INTERPRETED and level != INTERPRETED and decisions:  # planned so
        return (INTERPRETED, 0, f"planned so: its hooked form missed the budget it was made for, or ran slower "
                                f"({reason or 'actions at later hook points'})", *run(INTERPRETED, decisions, {}, {}))
    out = run(level, lowered, regions, holds)
    if not plan.level and (level == HOOKED or dropped):  # a plan whose level is not fixed yet
        why = f"its hooked form does not fit ({reason or 'later hook points'})"
        if not out[1][K.I_FEASIBLE]:
            return (INTERPRETED, 0, why, *run(INTERPRETED, decisions, {}, {}))
        if not limited(budget):
            other = run(INTERPRETED, decisions, {}, {})
            if other[1][K.I_PEAK] < out[1][K.I_PEAK]:
                return (INTERPRETED, 0, "its hooked form peaks higher", *other)
    if level == HOOKED:
        return _fewest_splits(sim, lowering, decisions, level, lowered, regions, holds, dropped, reason, run, out)
    return (level, dropped, reason, *out)


def _fewest_splits(sim, lowering, decisions, level, lowered, regions, holds, dropped, reason, run, out=None):
    """The hooked form's result, or the one with the optimizer's step run whole where it fits no slower
    (each split costs)."""
    out = run(level, lowered, regions, holds) if out is None else out
    if out[1][K.I_FEASIBLE] and lowering.installed(lowered, regions).updates:
        whole = ReferenceLowering(SimpleNamespace(trace=without_updates(sim.trace), lowering=sim.whole_step_lowering))
        w_level, w_lowered, w_regions, w_holds, w_dropped, w_reason = whole.lower(decisions)
        if w_level == HOOKED:
            other = run(HOOKED, w_lowered, w_regions, w_holds, whole)
            if other[1][K.I_FEASIBLE] and other[0][K.R_TIME] <= out[0][K.R_TIME]:
                return (HOOKED, w_dropped, w_reason, *other)
    return (level, dropped, reason, *out)
