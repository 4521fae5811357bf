"""Which module call a hooked plan runs again for each recompute decision (memplan.sim.lowering).

Recompute decisions due at one hook point are grouped by the smallest module call that makes
and saves their storages, writes nothing it did not make but module buffers (the executor
restores those), and reads only storages resident then or among its arguments (the executor
holds those from the call on, as torch.utils.checkpoint does: an argument the trace frees
earlier stays until the call's last run, `Regions.holds`). A larger call replaces smaller ones
where its one run takes fewer ops than theirs together. The call runs again from its first op
until it saved the last storage wanted (a RegionRun); its other new storages live only while it
runs. A decision no call can run is left out (memplan.sim.lowering drops it).

Which calls can run a decision depends on the rest of the plan only through which of their
inputs the plan keeps away at that point; everything else is a fact of the trace, computed
once, and a group's choice is reused while those answers are the same (search planners lower
thousands of plans that differ in a few decisions).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..model import Trace
from ..model.program import RegionRun
from .chains import Chain, ChainStep
from .decisions import DecisionArrays

GROUPS_KEPT = 100_000  # group choices remembered before the memo starts over (bounds its memory)


@dataclass(frozen=True, kw_only=True)
class _Run:
    """One region run and what it costs."""

    run: RegionRun  # the call, where it stops, what it captures
    chain: Chain  # its time and memory, as the first capture's chain (the others adopted)


class _Away:
    """Where a plan keeps its storages away: open intervals (out_after, back_before) per storage."""

    def __init__(self, arrays: DecisionArrays):
        self.arrays = arrays
        self.decided = set(arrays.storage.tolist())
        self._gaps: dict[int, list[tuple[int, int]]] | None = None

    def any_at(self, storages: frozenset, at: int) -> bool:
        """True when one of `storages` is away at op `at`."""
        if storages.isdisjoint(self.decided):
            return False
        if self._gaps is None:
            self._gaps = {}
            a = self.arrays
            for s, lo, hi in zip(a.storage.tolist(), a.out_after.tolist(), a.back_before.tolist()):
                self._gaps.setdefault(s, []).append((lo, hi))
        return any(lo < at < hi for r in storages & self.decided for lo, hi in self._gaps[r])


class Regions:
    """Region runs of one trace's module calls (per-trace facts computed once)."""

    def __init__(self, trace: Trace, durations: np.ndarray, first_pack: dict[int, int]):
        self.trace = trace
        self.durations = durations
        self.first_pack = first_pack  # storage -> index of its first pack
        self.calls = trace.calls
        self._buffers = frozenset(o.storage for o in trace.owners if o.kind == "buffer")
        self._runs: dict = {}  # (call, captures) -> _Run
        self._able: dict = {}  # (storage, op) -> ((call, inputs), ...) that can run it where no input is away
        self._inputs_memo: dict = {}
        self._groups: dict = {}  # (op, storages, valid calls) -> the run of each storage (None: no call)

    def assign(self, arrays: DecisionArrays) -> tuple[dict[int, RegionRun], list[int]]:
        """The region run of every recompute decision of `arrays` (by position), and the positions of
        those no call can run (ascending)."""
        rec = np.flatnonzero(arrays.recompute)
        if not len(rec):
            return {}, []
        groups: dict[int, list[int]] = {}
        for k, at in zip(rec.tolist(), arrays.back_before[rec].tolist()):
            groups.setdefault(at, []).append(k)
        sids = arrays.storage.tolist()
        away = _Away(arrays)
        out: dict[int, RegionRun] = {}
        unmade: list[int] = []
        for at, members in groups.items():
            storages = tuple(sids[k] for k in members)
            valid = tuple(tuple(c for c, inputs in self._able_calls(s, at) if not away.any_at(inputs, at))
                          for s in storages)
            for k, run in zip(members, self._group(at, storages, valid)):
                if run is None:
                    unmade.append(k)
                else:
                    out[k] = run
        return out, sorted(unmade)

    def holds(self, arrays: DecisionArrays, regions: dict[int, RegionRun]) -> dict[int, int]:
        """Arguments of calls run again that the trace frees before their last run: held until it."""
        back = arrays.back_before
        last: dict[int, int] = {}
        for k, run in regions.items():
            last[run.call] = max(last.get(run.call, 0), int(back[k]))
        storages = self.trace.storages
        out: dict[int, int] = {}
        for c, at in last.items():
            for a in self.calls[c].args:
                if not storages[a].persistent and storages[a].free_op <= at:
                    out[a] = max(out.get(a, 0), at + 1)
        return out

    def ordered(self, arrays: DecisionArrays, regions: dict[int, RegionRun],
                producers: np.ndarray) -> list[tuple[int, Chain | None]]:
        """The recompute decisions of a hooked plan in the order they run (producer order at each op),
        each with its run's chain, or None when an earlier one at that op runs the same call (it is
        adopted from that run)."""
        back, sid = arrays.back_before, arrays.storage
        out: list[tuple[int, Chain | None]] = []
        seen: set = set()
        for k in sorted(regions, key=lambda k: (back[k], producers[sid[k]], k)):
            run = regions[k]
            key = (run, int(back[k]))
            out.append((k, None if key in seen else self._run(run.call, run.captures).chain))
            seen.add(key)
        return out

    def chains(self, arrays: DecisionArrays, regions: dict[int, RegionRun], producers: np.ndarray) -> dict[int, Chain]:
        """The chain of every recompute decision of a hooked plan: the first of a run (in producer
        order) carries the run's time and memory, the others are adopted by it."""
        out: dict[int, Chain] = {}
        for k, chain in self.ordered(arrays, regions, producers):
            if chain is None:
                out[k] = Chain(steps=(), adopted=(), seconds=0.0, alloc_bytes=0, transient_bytes=0)
                continue
            mine = int(arrays.storage[k])
            others = tuple(sid for _, sid in regions[k].captures if sid != mine)
            out[k] = replace(chain, steps=(replace(chain.steps[0], storage=mine),), adopted=others)
        return out

    def run_ops(self, c: int, sids) -> int:
        """Ops a run of call `c` takes to save every storage of `sids`."""
        return max(self.trace.saved[self.first_pack[s]].packed_at for s in sids) - self.calls[c].first_op

    # --- one op's group -----------------------------------------------------------------------

    def _group(self, at: int, storages: tuple[int, ...], valid: tuple[tuple[int, ...], ...]) -> tuple:
        """The run of each of `storages` (recomputed at op `at`; `valid`: the calls that can run each,
        smallest first), None where no call can."""
        key = (at, storages, valid)
        runs = self._groups.get(key)
        if runs is None:
            made = {j: calls for j, calls in enumerate(valid) if calls}
            by_call: dict[int, list[int]] = {}
            for j, call in _fewest_ops(self, made, storages).items():
                by_call.setdefault(call, []).append(j)
            found: list = [None] * len(storages)
            for call, js in by_call.items():
                run = self._run(call, tuple(sorted((self.first_pack[storages[j]], storages[j]) for j in js))).run
                for j in js:
                    found[j] = run
            if len(self._groups) >= GROUPS_KEPT:
                self._groups.clear()
            runs = self._groups[key] = tuple(found)
        return runs

    def _able_calls(self, sid: int, at: int) -> tuple[tuple[int, frozenset], ...]:
        """(call, inputs) of the calls that can rebuild `sid` before op `at`, smallest first, where none
        of `inputs` (what the run reads that existed before the call) is away: each input is resident
        then or an argument of the call."""
        key = (sid, at)
        if key not in self._able:
            storages = self.trace.storages
            found = []
            for c, stop in self._candidates(sid, at):
                inputs = self._inputs(c, stop)
                if all(storages[r].alloc_op <= at < storages[r].free_op or r in self.calls[c].args for r in inputs):
                    found.append((c, inputs))
            self._able[key] = tuple(found)
        return self._able[key]

    def _candidates(self, sid: int, at: int) -> list[tuple[int, int]]:
        """(call, stop) of every call that makes `sid` and saves it before op `at` and writes nothing that
        existed before it but module buffers (restored after a run), smallest first; the model's own
        call is none (it would run the whole forward again from the step's inputs)."""
        writers = [i for i in self.trace.writers[sid] if i < at]
        pack = self.first_pack[sid]
        stop = self.trace.saved[pack].packed_at
        found = [(call.end_op - call.first_op, c) for c, call in enumerate(self.calls)
                 if call.module and call.first_op <= writers[0] and writers[-1] < call.end_op
                 and call.first_saved <= pack < call.end_saved and self._rerunnable(c, stop)]
        return [(c, stop) for _, c in sorted(found)]

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

    # --- one run ------------------------------------------------------------------------------

    def _run(self, c: int, captures: tuple[tuple[int, int], ...]) -> _Run:
        """The run of call `c` that captures `captures`, and its chain (time and memory)."""
        key = (c, captures)
        if key not in self._runs:
            stop = max(self.trace.saved[k].packed_at for k, _ in captures)
            call = self.calls[c]
            wanted = tuple(sid for _, sid in captures)
            transient = self._transient_bytes(c, stop, set(wanted))
            kept = sum(int(self.trace.nbytes[s]) for s in wanted)
            ops = tuple(range(call.first_op, stop))
            chain = Chain(steps=(ChainStep(storage=wanted[0], ops=ops, temporary=False),), adopted=wanted[1:],
                          seconds=float(self.durations[call.first_op:stop].sum()), alloc_bytes=kept + transient,
                          transient_bytes=transient, free_bytes=transient, inputs=self._inputs(c, stop))
            self._runs[key] = _Run(run=RegionRun(call=c, stop=stop, captures=captures), chain=chain)
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


def _fewest_ops(regions: Regions, valid: dict[int, tuple[int, ...]], storage: tuple[int, ...]) -> dict[int, int]:
    """A call for each member (keys of `valid`, whose values are the calls that can rebuild its storage,
    smallest first) such that the runs take few ops: one run of a call makes all it is given, so a
    larger call replaces smaller ones where its one run is shorter than theirs together (`storage`:
    each member's storage)."""
    chosen = {k: calls[0] for k, calls in valid.items()}

    def cost(assigned: dict[int, int]) -> int:
        runs: dict[int, list[int]] = {}
        for k, c in assigned.items():
            runs.setdefault(c, []).append(storage[k])
        return sum(regions.run_ops(c, sids) for c, sids in runs.items())

    best = cost(chosen)
    for c in sorted({c for calls in valid.values() for c in calls},
                    key=lambda c: regions.calls[c].end_op - regions.calls[c].first_op):
        trial = {k: (c if c in valid[k] else chosen[k]) for k in valid}
        trial_cost = cost(trial)
        if trial_cost < best:
            chosen, best = trial, trial_cost
    return chosen
