"""Lower a plan onto what the executor can act on without interpreting every op.

Lower the plan, do not interpret it (docs/executor.md, "How it runs"). A plan runs at one of three levels:

- plain: no decision; nothing is installed in the step.
- hooked: the decisions take tensors autograd saved (`Trace.saved`) out of memory until backward
  needs them (then autograd alone holds them: memplan.exec.hooked, rule 1). The executor (memplan.exec.hooked) acts only at saved-tensor packs and unpacks, the
  step's points with a hook (memplan.model.hookpoints), and recomputes by running a module call
  again (a region) as ordinary PyTorch. So the plan is moved onto those points: a swap-out or
  drop after op i happens at the first hook point at or after i + 1, a prefetch at the last one
  at or before its trigger, a recomputation at the last one at or before its op (a gap left
  empty is dropped: the storage stays). Recompute decisions due at one point are grouped by the
  smallest module call that makes and saves their storages, writes nothing it did not make but
  module buffers (the executor restores those), and reads only storages resident then or among
  its arguments (the executor holds those from the call on, as torch.utils.checkpoint does: an
  argument the trace frees earlier stays until the call's last run, `Lowered.holds`). The call
  runs again from its first op until it saved the last storage wanted (`RegionRun`); its other
  new storages live only while it runs. A decision none of this can run is dropped (kept
  resident): `dropped` counts them.
- interpreted: the dispatch-mode runner (memplan.exec.runner) acts before and after every op and
  recomputes by replaying ops (memplan.sim.chains): for micro-batched convolutions, a trace
  without hook records, or a plan whose hooked form does not fit its budget (the simulator
  decides: memplan.sim.simulate).

The simulator simulates the lowered plan, so what it predicts is what the executor runs.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace

import numpy as np

from ..model import Decision, Trace
from ..model.hookpoints import first_packs, hook_points
from ..model.program import HOOKED, INTERPRETED, PLAIN, RegionRun
from .chains import Chain, ChainStep


@dataclass(frozen=True, kw_only=True)
class Lowered:
    """A plan's decisions at the level the executor runs them."""

    level: str  # one of memplan.model.program.LEVELS
    decisions: tuple[Decision, ...]  # hooked: moved onto hook points; else as planned
    regions: dict[int, RegionRun] = field(default_factory=dict)  # hooked: recompute decision -> its run
    holds: dict[int, int] = field(default_factory=dict)  # hooked: storage -> the later free_op its run's hold gives it
    dropped: int = 0  # hooked: decisions left out (kept resident): no hook point or region runs them
    reason: str = ""  # why the first dropped decision was, or why the plan is interpreted


class Lowering:
    """Lowers plans of one trace (per-trace facts are computed once; search planners lower many)."""

    def __init__(self, trace: Trace, durations: np.ndarray):
        self.trace = trace
        self.durations = durations
        self.points = hook_points(trace.saved, len(trace.ops))
        self.first_pack = first_packs(trace.saved)  # storage -> index of its first pack
        self.calls = trace.calls
        self._buffers = frozenset(o.storage for o in trace.owners if o.kind == "buffer")
        self._runs: dict = {}  # (call, stop, captures) -> (RegionRun, Chain)
        self._candidates_memo: dict = {}
        self._inputs_memo: dict = {}

    # --- points ------------------------------------------------------------------------------

    def after(self, point: int) -> int:
        """The first hook point at or after `point`."""
        return self.points[bisect.bisect_left(self.points, point)]

    def before(self, point: int) -> int:
        """The last hook point at or before `point`."""
        return self.points[bisect.bisect_right(self.points, point) - 1]

    # --- plans -------------------------------------------------------------------------------

    def lower(self, decisions) -> Lowered:
        """The hooked form of `decisions` (interpreted where it cannot be hooked at all)."""
        if not decisions:
            return Lowered(level=PLAIN, decisions=())
        decisions = tuple(decisions)
        if not self.trace.saved:
            return Lowered(level=INTERPRETED, decisions=decisions,
                           reason="the trace has no saved-tensor records (traced before memplan recorded them)")
        if self.trace.engine_owned and any(d.action == "recompute" for d in decisions):
            return Lowered(level=INTERPRETED, decisions=decisions,  # DDP and FSDP2 hook their modules' calls
                           reason="a data-parallel engine's module calls do not run again alone: replayed op by op")
        reasons = [self._unhookable(d) for d in decisions]
        moved = tuple(m for m, why in zip(map(self._moved, decisions), reasons) if m is not None and not why)
        regions, unmade = self._regions(moved)
        kept = tuple(d for k, d in enumerate(moved) if k not in unmade)
        regions = {kept.index(moved[k]): run for k, run in regions.items()} if unmade else regions
        why = next((r for r in reasons if r), "") or (
            f"no module call can recompute storage {moved[min(unmade)].storage}" if unmade else "")
        if not kept:  # nothing left to act on
            return Lowered(level=PLAIN, decisions=(), dropped=len(decisions), reason=why)
        return Lowered(level=HOOKED, decisions=kept, regions=regions, holds=self._holds(kept, regions),
                       dropped=len(decisions) - len(kept), reason=why)

    def _unhookable(self, d: Decision) -> str:
        """Why `d` cannot run at hook points ("" when it can)."""
        first = self.first_pack.get(d.storage)
        if first is None:
            return f"storage {d.storage} is not a tensor autograd saves"
        if d.wraps or self.trace.ops[d.back_before].phase != "backward":
            return f"storage {d.storage} is away until op {d.back_before}, not until backward unpacks it"
        if self.trace.saved[first].packed_at > self.after(d.out_after + 1):
            return f"storage {d.storage} leaves before autograd saves it"
        return ""

    def _moved(self, d: Decision) -> Decision | None:
        """`d` on hook points (None when its gap is left empty there)."""
        out = self.after(d.out_after + 1) - 1
        if d.action == "recompute":
            back = self.before(d.back_before)
            return replace(d, out_after=out, back_before=back) if back > out + 1 else None
        if out + 1 >= d.back_before:
            return None
        return replace(d, out_after=out, trigger=max(self.before(d.prefetch_at), out + 1), overlap=False)

    # --- regions -----------------------------------------------------------------------------

    def _regions(self, decisions: tuple[Decision, ...]) -> tuple[dict[int, RegionRun], set[int]]:
        """The region run of every recompute decision, and the decisions no call can recompute."""
        groups: dict[int, list[int]] = {}
        for k, d in enumerate(decisions):
            if d.action == "recompute":
                groups.setdefault(d.back_before, []).append(k)
        away = _away(decisions) if groups else {}
        out: dict[int, RegionRun] = {}
        unmade: set[int] = set()
        for at, members in groups.items():
            valid = {k: self._valid_calls(decisions[k].storage, at, away) for k in members}
            unmade.update(k for k, calls in valid.items() if not calls)
            by_call: dict[int, list[int]] = {}
            made = {k: calls for k, calls in valid.items() if calls}
            for k, call in _fewest_ops(self, made, {k: decisions[k].storage for k in made}).items():
                by_call.setdefault(call, []).append(k)
            for call, ks in by_call.items():
                run = self._run(call, tuple(sorted((self.first_pack[decisions[k].storage], decisions[k].storage)
                                                   for k in ks)))[0]
                out.update((k, run) for k in ks)
        return out, unmade

    def _holds(self, decisions, regions: dict[int, RegionRun]) -> dict[int, int]:
        """Arguments of calls run again that the trace frees before their last run: held until it."""
        last: dict[int, int] = {}
        for k, run in regions.items():
            last[run.call] = max(last.get(run.call, 0), decisions[k].back_before)
        storages = self.trace.storages
        out: dict[int, int] = {}
        for c, at in last.items():
            for a in self.calls[c].args:
                if not storages[a].persistent and storages[a].free_op <= at:
                    out[a] = max(out.get(a, 0), at + 1)
        return out

    def _valid_calls(self, sid: int, at: int, away: dict[int, list[tuple[int, int]]]) -> list[int]:
        """The calls that can rebuild `sid` before op `at` under a plan whose gaps are `away`, smallest first."""
        storages = self.trace.storages
        return [c for c, stop in self._candidates(sid, at)
                if all((storages[r].alloc_op <= at < storages[r].free_op or r in self.calls[c].args)
                       and not any(lo < at < hi for lo, hi in away.get(r, ())) for r in self._inputs(c, stop))]

    def run_ops(self, c: int, sids) -> int:
        """Ops a run of call `c` takes to save every storage of `sids`."""
        return max(self.trace.saved[self.first_pack[s]].packed_at for s in sids) - self.calls[c].first_op

    def _candidates(self, sid: int, at: int) -> list[tuple[int, int]]:
        """(call, stop) of every call that makes `sid` and saves it before op `at` and writes nothing that
        existed before it but module buffers (restored after a run), smallest first; the model's own
        call is none (it would run the whole forward again from the step's inputs)."""
        key = (sid, at)
        if key not in self._candidates_memo:
            writers = [i for i in self.trace.writers[sid] if i < at]
            pack = self.first_pack[sid]
            stop = self.trace.saved[pack].packed_at
            found = [(call.end_op - call.first_op, c) for c, call in enumerate(self.calls)
                     if call.module and call.first_op <= writers[0] and writers[-1] < call.end_op
                     and call.first_saved <= pack < call.end_saved and self._rerunnable(c, stop)]
            self._candidates_memo[key] = [(c, stop) for _, c in sorted(found)]
        return self._candidates_memo[key]

    def _rerunnable(self, c: int, stop: int) -> bool:
        first = self.calls[c].first_op
        storages = self.trace.storages
        return all(storages[w].alloc_op >= first or w in self._buffers
                   for i in range(first, stop) for w in self.trace.ops[i].writes)

    def _inputs(self, c: int, stop: int) -> frozenset:
        """Storages ops first..stop-1 of call `c` read that existed before it."""
        key = (c, stop)
        if key not in self._inputs_memo:
            first = self.calls[c].first_op
            storages = self.trace.storages
            self._inputs_memo[key] = frozenset(r for i in range(first, stop) for r in self.trace.ops[i].reads
                                               if storages[r].alloc_op < first)
        return self._inputs_memo[key]

    def _run(self, c: int, captures: tuple[tuple[int, int], ...]) -> tuple[RegionRun, Chain]:
        """The run of call `c` that captures `captures`, and its chain (time and memory)."""
        stop = max(self.trace.saved[k].packed_at for k, _ in captures)
        key = (c, stop, captures)
        if key not in self._runs:
            call = self.calls[c]
            run = RegionRun(call=c, stop=stop, captures=captures)
            wanted = tuple(sid for _, sid in captures)
            transient = self._transient_bytes(c, stop, set(wanted))
            kept = sum(int(self.trace.nbytes[s]) for s in wanted)
            ops = tuple(range(call.first_op, stop))
            chain = Chain(steps=(ChainStep(storage=wanted[0], ops=ops, temporary=False),), adopted=wanted[1:],
                          seconds=float(self.durations[call.first_op:stop].sum()), alloc_bytes=kept + transient,
                          transient_bytes=transient, free_bytes=transient,
                          inputs=self._inputs(c, stop))
            self._runs[key] = (run, chain)
        return self._runs[key]

    def _transient_bytes(self, c: int, stop: int, wanted: set) -> int:
        """The largest memory a run of call `c` holds at once beside what it captures. What it makes
        lives as long as in the step (Python frees it at the same point of the same code), but a
        tensor autograd saves, which the run's graph holds until the run stops. When the call updates
        module buffers, the executor copies all of its module's first (to restore them after)."""
        trace, first = self.trace, self.calls[c].first_op
        delta = np.zeros(stop - first + 1, dtype=np.int64)
        for i in range(first, stop):
            for w in trace.ops[i].writes:
                s = trace.storages[w]
                if s.alloc_op == i and w not in wanted:
                    end = stop if w in self.first_pack else min(s.free_op, stop)
                    delta[i - first] += s.nbytes
                    delta[end - first] -= s.nbytes
        return int(np.cumsum(delta).max(initial=0)) + self._buffer_copies(c)

    def _buffer_copies(self, c: int) -> int:
        """Bytes of the module buffers a run of call `c` copies: all of its module's, if it updates any
        (memplan.exec.hooked does the same)."""
        call = self.calls[c]
        if not any(w in self._buffers for i in range(call.first_op, call.end_op) for w in self.trace.ops[i].writes):
            return 0
        prefix = call.module + "."
        return sum(self.trace.storages[o.storage].nbytes for o in self.trace.owners
                   if o.kind == "buffer" and o.name.startswith(prefix))

    def chains(self, lowered: Lowered, producers: np.ndarray) -> dict[int, Chain]:
        """The chain of every recompute decision of a hooked plan: the first of a run (in producer
        order) carries the run's time and memory, the others are adopted by it."""
        out: dict[int, Chain] = {}
        order = sorted(lowered.regions, key=lambda k: (lowered.decisions[k].back_before,
                                                       producers[lowered.decisions[k].storage], k))
        seen: set = set()
        for k in order:
            run = lowered.regions[k]
            key = (run, lowered.decisions[k].back_before)
            if key in seen:
                out[k] = Chain(steps=(), adopted=(), seconds=0.0, alloc_bytes=0, transient_bytes=0)
                continue
            seen.add(key)
            chain = self._run(run.call, run.captures)[1]
            mine = lowered.decisions[k].storage
            others = tuple(sid for _, sid in run.captures if sid != mine)
            out[k] = replace(chain, steps=(replace(chain.steps[0], storage=mine),), adopted=others)
        return out


def _fewest_ops(lowering: Lowering, valid: dict[int, list[int]], storage: dict[int, int]) -> dict[int, int]:
    """A call for each decision (keys of `valid`, whose values are the calls that can rebuild its
    storage, smallest first) such that the runs take few ops: one run of a call makes all it is
    given, so a larger call replaces smaller ones where its one run is shorter than theirs together
    (`storage`: each decision's storage)."""
    chosen = {k: calls[0] for k, calls in valid.items()}

    def cost(assigned: dict[int, int]) -> int:
        runs: dict[int, list[int]] = {}
        for k, c in assigned.items():
            runs.setdefault(c, []).append(storage[k])
        return sum(lowering.run_ops(c, sids) for c, sids in runs.items())

    best = cost(chosen)
    for c in sorted({c for calls in valid.values() for c in calls},
                    key=lambda c: lowering.calls[c].end_op - lowering.calls[c].first_op):
        trial = {k: (c if c in valid[k] else chosen[k]) for k in valid}
        trial_cost = cost(trial)
        if trial_cost < best:
            chosen, best = trial, trial_cost
    return chosen


def _away(decisions) -> dict[int, list[tuple[int, int]]]:
    """Per storage, the open intervals (out_after, back_before) its data is absent in."""
    out: dict[int, list[tuple[int, int]]] = {}
    for d in decisions:
        out.setdefault(d.storage, []).append((d.out_after, d.back_before))
    return out
