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
from functools import cached_property

import numpy as np

from ..model import Trace
from ..model.hooksites import HookSites
from ..model.program import RegionRun
from .chains import Chain, ChainStep
from .decisions import DecisionArrays

GROUPS_KEPT = 100_000  # groups of storages remembered before the memo starts over (bounds its memory)


@dataclass(frozen=True, kw_only=True)
class _Run:
    """One region run and what it costs."""

    run: RegionRun  # the call, where it stops, what it captures
    chain: Chain  # its time and memory, as the first capture's chain (the others adopted)


@dataclass(frozen=True, kw_only=True)
class _Group:
    """The region runs of the recompute decisions due at one op (its members, in plan order)."""

    made: tuple[int, ...]  # the members some call can run
    runs: tuple[RegionRun, ...]  # their runs
    unmade: tuple[int, ...]  # the members no call can run
    carriers: tuple[int, ...]  # the first member of each run in the order they run (producer order): it
    # carries the run's time and memory, the others are adopted
    chains: tuple[Chain, ...]  # the carriers' runs' chains
    read_codes: np.ndarray  # int64, sorted: op * storages + storage of each storage those runs read


@dataclass(frozen=True, kw_only=True)
class _Choices:
    """The groups of some storages recomputed at one op, by what their calls find away."""

    reads: frozenset  # what the calls that can run them read that existed before them
    by_gone: dict  # those of `reads` away -> _Group


class Assigned:
    """The region runs of a plan's recompute decisions (positions in its columns), put together when
    first asked for: a plan whose hooked form cannot fit needs only its `unmade` and `carriers`
    (memplan.sim.levels), and a search mostly meets such plans."""

    def __init__(self, parts: list, position: list[int] | None = None):
        self._parts = parts  # (members, _Group) of each op with recompute decisions, ops ascending
        self._position = position  # made decisions' new positions once the unmade are left out (None: same)

    def without_unmade(self, n: int) -> Assigned:
        """The same runs, positions among `n` decisions counted without the unmade ones (memplan.sim.lowering
        drops them)."""
        made = np.ones(n, dtype=np.bool_)
        made[self.unmade] = False
        return Assigned(self._parts, (np.cumsum(made) - 1).tolist())

    @cached_property
    def unmade(self) -> list[int]:
        """Recompute decisions no call can run, ascending (positions before any are left out)."""
        return sorted(members[j] for members, group in self._parts if group.unmade for j in group.unmade)

    @cached_property
    def carriers(self) -> list[tuple[int, Chain]]:
        """(decision, chain) of the decision that carries each run at its op."""
        return [(members[j], chain) for members, group in self._placed()
                for j, chain in zip(group.carriers, group.chains)]

    @cached_property
    def regions(self) -> dict[int, RegionRun]:
        """Recompute decision -> its run."""
        return {members[j]: run for members, group in self._placed() for j, run in zip(group.made, group.runs)}

    @cached_property
    def read_codes(self) -> np.ndarray:
        """int64, sorted: op * storages + storage of each storage a run due at op reads (the ops ascend,
        each group's codes in its own range)."""
        return np.concatenate([group.read_codes for _, group in self._parts]) if self._parts else _NO_CODES

    def _placed(self) -> list:
        if self._position is None:
            return self._parts
        at = self._position.__getitem__
        return [(list(map(at, members)), group) for members, group in self._parts]


_NO_CODES = np.zeros(0, dtype=np.int64)
NOTHING = Assigned([])


class _Away:
    """Where a plan keeps storages away: the open intervals (out_after, back_before) of its decisions."""

    def __init__(self, arrays: DecisionArrays, n_storages: int):
        storages = arrays.storage.tolist()
        self.decided = frozenset(storages)
        # One decision a storage (the usual plan): its gap by storage, in arrays (a few of them are read
        # per op, so building dicts of every decision cost more than the reads).
        self.single = len(self.decided) == len(storages)
        if self.single:
            self.lo, self.hi = np.zeros(n_storages, dtype=np.int64), np.zeros(n_storages, dtype=np.int64)
            self.lo[arrays.storage], self.hi[arrays.storage] = arrays.out_after, arrays.back_before
        else:
            self.gaps: dict[int, list[tuple[int, int]]] = {}
            for sid, lo, hi in zip(storages, arrays.out_after.tolist(), arrays.back_before.tolist()):
                self.gaps.setdefault(sid, []).append((lo, hi))

    def at(self, found: frozenset, op: int) -> frozenset:
        """Those of `found` (storages of `decided`) away at `op`."""
        if self.single:
            return frozenset(r for r in found if self.lo[r] < op < self.hi[r])
        return frozenset(r for r in found if any(lo < op < hi for lo, hi in self.gaps[r]))


class Regions:
    """Region runs of one trace's module calls (per-trace facts computed once)."""

    def __init__(self, trace: Trace, durations: np.ndarray, sites: HookSites, producers: np.ndarray):
        self.trace = trace
        self.durations = durations
        self.producers = producers  # storage -> the op that made it (-1: none); runs at one op go in that order
        self.sites = sites  # where the hooked executor acts (memplan.model.hooksites)
        self.first_pack = sites.first_pack  # storage -> index of its first pack
        self.calls = trace.calls
        self._buffers = frozenset(o.storage for o in trace.owners if o.kind == "buffer")
        self._runs: dict = {}  # (call, captures) -> _Run
        self._able: dict = {}  # (storage, op) -> ((call, inputs), ...) that can run it where no input is away
        self._inputs_memo: dict = {}
        self._groups: dict = {}  # (op, storages) -> _Choices
        self._never: dict = {}  # (storage, op) -> no call can run it there (`never_run`)

    def assign(self, arrays: DecisionArrays) -> Assigned:
        """The region run of every recompute decision of `arrays` (by position)."""
        rec = np.flatnonzero(arrays.recompute)
        if not len(rec):
            return NOTHING
        backs = arrays.back_before[rec]
        order = np.argsort(backs, kind="stable")
        ks, ats, sids = rec[order].tolist(), backs[order].tolist(), arrays.storage[rec[order]].tolist()
        starts = [0, *(np.flatnonzero(np.diff(backs[order])) + 1).tolist(), len(ks)]
        away = _Away(arrays, len(self.trace.storages))
        parts, groups, decided = [], self._groups, away.decided
        for lo, hi in zip(starts, starts[1:]):  # the loop a search runs for every plan: kept lean
            at, storages = ats[lo], tuple(sids[lo:hi])
            choices = groups.get((at, storages)) or self._choices(at, storages)
            found = choices.reads & decided
            gone = away.at(found, at) if found else found
            parts.append((ks[lo:hi], choices.by_gone.get(gone) or self._group(at, storages, gone, choices)))
        return Assigned(parts)

    def never_run(self, arrays: DecisionArrays) -> np.ndarray:
        """Per decision of `arrays` (on hook points): a recompute decision no call can run whatever the
        rest of the plan (`assign` leaves it unmade in every plan: a fact of the trace)."""
        never = np.zeros(len(arrays), dtype=np.bool_)
        rec = np.flatnonzero(arrays.recompute)
        keys = list(zip(arrays.storage[rec].tolist(), arrays.back_before[rec].tolist()))
        found = list(map(self._never.get, keys))  # a search asks this for every plan: one C loop when known
        if None in found:
            for j, key in enumerate(keys):
                if found[j] is None:
                    found[j] = self._never[key] = not self._able_calls(*key)
        never[rec] = found
        return never

    def holds(self, arrays: DecisionArrays, regions: dict[int, RegionRun]) -> dict[int, int]:
        """Arguments of calls run again that the trace frees before their last run: held until it."""
        back = arrays.back_before.tolist()
        last: dict[int, int] = {}
        for k, run in regions.items():
            last[run.call] = max(last.get(run.call, 0), back[k])
        storages = self.trace.storages
        out: dict[int, int] = {}
        for c, at in last.items():
            for a in self.calls[c].args:
                if not storages[a].persistent and storages[a].free_op <= at:
                    out[a] = max(out.get(a, 0), at + 1)
        return out

    def chains(self, arrays: DecisionArrays, regions: dict[int, RegionRun],
               carriers: list[tuple[int, Chain]]) -> dict[int, Chain]:
        """The chain of every recompute decision of a hooked plan: the first of a run (in producer
        order; `carriers`) carries the run's time and memory, the others are adopted by it."""
        carried = dict(carriers)
        out: dict[int, Chain] = {}
        for k in regions:
            chain = carried.get(k)
            if chain is None:
                out[k] = Chain(steps=(), adopted=(), seconds=0.0, alloc_bytes=0, transient_bytes=0)
                continue
            mine = int(arrays.storage[k])
            others = tuple(sid for _, sid in regions[k].captures if sid != mine)
            out[k] = replace(chain, steps=(replace(chain.steps[0], storage=mine),), adopted=others)
        return out

    def can_rebuild(self, sid: int, at: int) -> bool:
        """Whether some module call can rebuild `sid` for op `at` in some plan: a fact of the trace (the
        plan only takes calls away, by keeping their inputs away), which the lower bound reads."""
        return bool(self._rebuilders(sid, at))

    def least_run(self, sid: int, at: int) -> frozenset:
        """The ops every run that rebuilds `sid` for op `at` replays: from the start of the innermost
        call that can (calls nest) to its first pack (empty where none can)."""
        candidates = self._rebuilders(sid, at)
        if not candidates:
            return frozenset()
        first = max(self.calls[c].first_op for c, _ in candidates)
        return frozenset(range(first, candidates[0][1]))

    def run_ops(self, c: int, sids) -> int:
        """Ops a run of call `c` takes to save every storage of `sids`."""
        return max(self.trace.saved[self.first_pack[s]].packed_at for s in sids) - self.calls[c].first_op

    # --- one op's group -----------------------------------------------------------------------

    def _choices(self, at: int, storages: tuple[int, ...]) -> _Choices:
        """The memo of the groups of `storages` recomputed at op `at` (made empty)."""
        if len(self._groups) >= GROUPS_KEPT:
            self._groups.clear()
        reads = frozenset().union(*(inputs for s in storages for _, inputs in self._able_calls(s, at)))
        choices = self._groups[(at, storages)] = _Choices(reads=reads, by_gone={})
        return choices

    def _group(self, at: int, storages: tuple[int, ...], gone: frozenset, choices: _Choices) -> _Group:
        """The runs of `storages`, recomputed at op `at` where the storages `gone` (of those their
        calls read) are away."""
        valid = [tuple(c for c, inputs in self._able_calls(s, at) if inputs.isdisjoint(gone)) for s in storages]
        made = {j: calls for j, calls in enumerate(valid) if calls}
        by_call: dict[int, list[int]] = {}
        for j, call in _fewest_ops(self, made, storages).items():
            by_call.setdefault(call, []).append(j)
        runs: dict[int, RegionRun] = {}
        for call, js in by_call.items():
            run = self._run(call, tuple(sorted((self.first_pack[storages[j]], storages[j]) for j in js))).run
            runs.update((j, run) for j in js)
        carriers, seen = [], set()
        for j in sorted(made, key=lambda j: (self.producers[storages[j]], j)):
            if runs[j] not in seen:
                seen.add(runs[j])
                carriers.append((j, self._run(runs[j].call, runs[j].captures).chain))
        read = sorted({r for _, chain in carriers for r in chain.inputs})
        made_js = sorted(runs)
        group = choices.by_gone[gone] = _Group(
            made=tuple(made_js), runs=tuple(runs[j] for j in made_js),
            unmade=tuple(j for j in range(len(storages)) if j not in runs),
            carriers=tuple(j for j, _ in carriers), chains=tuple(chain for _, chain in carriers),
            read_codes=at * len(self.trace.storages) + np.array(read, dtype=np.int64))
        return group

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

    def _rebuilders(self, sid: int, at: int) -> list[tuple[int, int]]:
        """`_candidates` of a storage autograd saves and the trace makes before op `at` (else none)."""
        writers = self.trace.writers[sid]
        return self._candidates(sid, at) if sid in self.first_pack and writers and writers[0] < at else []

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
            kept = sum(int(self.trace.nbytes[s]) for s in wanted)
            transient = self._held_bytes(c, stop) - kept
            ops = tuple(range(call.first_op, stop))
            chain = Chain(steps=(ChainStep(storage=wanted[0], ops=ops, temporary=False),), adopted=wanted[1:],
                          seconds=float(self.durations[call.first_op:stop].sum()), alloc_bytes=kept + transient,
                          transient_bytes=transient, free_bytes=transient, inputs=self._inputs(c, stop))
            self._runs[key] = _Run(run=RegionRun(call=c, stop=stop, captures=captures), chain=chain)
        return self._runs[key]

    def _held_bytes(self, c: int, stop: int) -> int:
        """The largest memory a run of call `c` until op `stop` holds at once, what it captures included
        from the op that makes it on (not all from the run's start: a layer's early transients are gone
        before its last capture is made). What it makes lives as long as in the step (Python frees it at
        the same point of the same code), but a tensor autograd saves (captured or not), which the run's
        graph holds until the run stops. When the call updates module buffers, the executor copies all of
        its module's first (to restore them after)."""
        trace, first = self.trace, self.calls[c].first_op
        delta = np.zeros(stop - first + 1, dtype=np.int64)
        for i in range(first, stop):
            for w in trace.ops[i].writes:
                s = trace.storages[w]
                if s.alloc_op == i:
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
