"""Where the hooked executor acts in a step, which decisions it can run there, and what its hooks cost.

A site is a hook PyTorch calls during the step (memplan.model.hookpoints), at a point (the ops
completed when it fires):

- the step's start (point 0) and end (point n): the runtime's own calls, free;
- a mark: a parameter's gradient accumulated (a hook on that parameter, fired at each of its
  accumulations), the optimizer's step beginning or ending (its step pre- and post-hooks) or, where
  it steps a parameter at a time, beginning a parameter's update (the executor then runs the step
  in stretches, memplan.tracing.stepwise: such a firing also costs a stretch, `stretches`);
- a module call's start or end (a forward pre-hook or a forward hook on the module, fired at
  every call of it; a module that opens windows or holds a region's arguments gets both);
- a saved tensor's pack and first unpack, seen only inside a *window*: a module call during which
  the executor's saved-tensor hooks are installed (pushed at its pre-hook, popped at its forward
  hook; the whole step for a tensor saved outside every call). Outside windows autograd saves
  tensors without calling Python: what the plan never moves costs nothing.

One rule says which decisions can run at sites (`HookSites.unhooked`): a swap of a storage an
owner holds (a parameter, buffer, gradient or optimizer state: `Trace.owners`) finds it through
its owner, at any point, in any gap, across the step's boundary too; any other decision finds its
storage by its first pack (a recomputation captures it there from its region's run), so it must be
saved by autograd before it leaves and be away only until backward (where an unpack that comes
early brings it back: memplan.exec.hooked, rule 3). The simulator's lowering
(memplan.sim.lowering), the validator and the planners' bounds read it here; the executor runs what
the simulator lowered.

Which sites a plan's program needs is `HookSites.installed`: a window around every pack of a
storage the plan moves (the executor takes the storage there, and guards its unpacks; the outermost
such call only, so that the modules inside a region run again cost no hook calls), and at
every other point an action runs at, the cheapest site there. The executor installs exactly these
(memplan.exec.hooked), and the simulator charges the host one hook call per firing (`firings`).
"""

from __future__ import annotations

import bisect
from itertools import repeat
from dataclasses import dataclass, replace

import numpy as np

from .hookpoints import first_packs

WHOLE_STEP = -1  # the window of a tensor saved outside every module call


@dataclass(frozen=True, kw_only=True)
class Installed:
    """The sites a step program needs (what memplan.exec.hooked installs)."""

    windows: frozenset  # calls whose packs the executor sees (WHOLE_STEP: every pack of the step)
    modules: frozenset  # paths of modules given a forward pre-hook and a forward hook (windows, regions)
    starts: frozenset = frozenset()  # paths of other modules given only a forward pre-hook (a call's start)
    ends: frozenset = frozenset()  # paths of other modules given only a forward hook (a call's end)
    marks: frozenset  # (kind, key) of the marks hooked
    hooked_packs: np.ndarray  # bool per pack: inside a window

    @property
    def updates(self) -> list[str]:
        """The parameters whose update marks are hooked: the optimizer's step is split there."""
        return [key for kind, key in self.marks if kind == "update"]


class HookSites:
    """The sites of one trace's step, and the rule of which decisions can run there."""

    def __init__(self, trace):
        self.trace = trace
        n = self.n_ops = len(trace.ops)
        saved, calls = trace.saved, trace.calls
        self.packed_at = np.array([s.packed_at for s in saved], dtype=np.int64)
        self.unpacked_at = np.array([-1 if s.unpacked_at is None else s.unpacked_at for s in saved], dtype=np.int64)
        marks = {0, n, *self.packed_at.tolist(), *(p for p in self.unpacked_at.tolist() if p >= 0),
                 *(c.first_op for c in calls), *(c.end_op for c in calls), *(m.point for m in trace.marks)}
        self.points = sorted(marks)
        every = np.arange(n + 1)
        self.after_of = np.array(self.points)[np.searchsorted(self.points, every)]  # first point at or after p
        self.before_of = np.array(self.points)[np.searchsorted(self.points, every, side="right") - 1]
        self.first_pack = first_packs(saved)  # storage -> index of its first pack
        self.first_packed_at = np.full(len(trace.storages), -1, dtype=np.int64)
        for sid, k in self.first_pack.items():
            self.first_packed_at[sid] = saved[k].packed_at
        self.owned = np.zeros(len(trace.storages), dtype=np.bool_)
        self.owned[[o.storage for o in trace.owners]] = True
        self.backward = np.array([op.phase == "backward" for op in trace.ops], dtype=np.bool_)
        self._packs_of: dict[int, list[int]] = {}
        for k, s in enumerate(saved):
            if s.storage is not None:
                self._packs_of.setdefault(s.storage, []).append(k)
        self.window_of = _innermost_calls(calls, len(saved))
        self._module_points = {}  # module path -> the points its hooks fire at (each call's start and end)
        self._edge_points = {}  # ("start" or "end", module path) -> the points its one hook fires at
        for c in calls:
            self._module_points.setdefault(c.module, []).extend((c.first_op, c.end_op))
            self._edge_points.setdefault(("start", c.module), []).append(c.first_op)
            self._edge_points.setdefault(("end", c.module), []).append(c.end_op)
        self._mark_points = {}  # (kind, key) -> the points that mark fires at
        for m in trace.marks:
            self._mark_points.setdefault((m.kind, m.key), []).append(m.point)
        self._candidates = self._sites_by_point()
        # Per storage the windows of its packs, and the points of each module and mark as arrays: a
        # search asks for the sites of many plans (memplan.sim.lowering).
        self._windows_of = {sid: frozenset(int(self.window_of[k]) for k in packs) for sid, packs in self._packs_of.items()}
        self._module_array = {m: np.array(p, dtype=np.int64) for m, p in self._module_points.items()}
        self._edge_array = {k: np.array(p, dtype=np.int64) for k, p in self._edge_points.items()}
        self._mark_array = {k: np.array(p, dtype=np.int64) for k, p in self._mark_points.items()}

    # --- points ------------------------------------------------------------------------------

    def after(self, point: int) -> int:
        """The first site's point at or after `point`."""
        return self.points[bisect.bisect_left(self.points, point)]

    def before(self, point: int) -> int:
        """The last site's point at or before `point`."""
        return self.points[bisect.bisect_right(self.points, point) - 1]

    # --- the rule ------------------------------------------------------------------------------

    def unhooked(self, storage: np.ndarray, recompute: np.ndarray, out_after: np.ndarray,
                 back_before: np.ndarray) -> np.ndarray:
        """Per decision (storage, action, gap): True where no site can run it (`reason` says why)."""
        first = self.first_packed_at[storage]
        moved_out = self.after_of[out_after + 1] - 1
        found_by_pack = (first >= 0) & (back_before > out_after) & self.backward[back_before] & \
            (first <= moved_out + 1)
        return ~((self.owned[storage] & ~recompute) | found_by_pack)

    def reason(self, d) -> str:
        """Why decision `d` cannot run at sites ("" when it can), naming its storage and action."""
        s = self.trace.storages[d.storage]
        what = f"{d.action} of storage {d.storage} ({s.kind}{', ' + s.name if s.name else ''})"
        if self.owned[d.storage] and d.action == "swap":
            return ""
        first = self.first_pack.get(d.storage)
        if first is None:
            return f"{what}: no hook sees it (autograd does not save it, and no module or optimizer holds it)"
        if d.wraps or not self.backward[d.back_before]:
            return f"{what}: away until op {d.back_before}, which reads it outside backward (no hook guards that)"
        if self.trace.saved[first].packed_at > self.after(d.out_after + 1):
            return f"{what}: it leaves before autograd saves it"
        return ""

    # --- installation ----------------------------------------------------------------------------

    def packs_hooked_for(self, sid: int) -> np.ndarray:
        """The packs (indices into Trace.saved) whose hooks every program that moves storage `sid` installs:
        the windows of its packs are installed, and each hooks every pack saved inside its call."""
        calls, saved = self.trace.calls, len(self.trace.saved)
        spans = [(0, saved) if c == WHOLE_STEP else (calls[c].first_saved, calls[c].end_saved)
                 for c in self._windows_of.get(sid, ())]
        return np.array(sorted({k for lo, hi in spans for k in range(lo, hi)}), dtype=np.int64)

    def pack_firings(self, pack: int) -> list[int]:
        """The ops whose host work a hooked pack's hooks add to (`firings`): its pack's, and its unpack's."""
        at = [int(self.packed_at[pack])] + ([int(self.unpacked_at[pack])] if self.unpacked_at[pack] >= 0 else [])
        return [min(p, max(self.n_ops, 1) - 1) for p in at]

    def installed(self, points, moved, regions=()) -> Installed:
        """The sites a program needs: windows around every pack of the storages `moved` and around the
        `regions` (calls run again: their modules hold a region's arguments, and what such a call saves
        must not meet autograd's version check after a run updated module buffers in place), and at
        each of `points` where no site fires yet, the cheapest one there."""
        windows = self._outermost(set(regions).union(*map(self._windows_of.get, _ints(moved), repeat(()))))
        # a region's module is hooked even where an outer window sees its packs: its call's arguments are held
        modules, marks, edges = self._window_modules(windows) | self._window_modules(regions), set(), set()
        hooked = self._hooked_packs(windows)
        covered = self._covered(hooked, modules, marks)
        for p in sorted(set(_ints(points)) - covered):
            if p in covered:  # a site chosen for an earlier point fires here too
                continue
            kind, site = min(self._candidates[p], key=lambda c: self._price(c, windows, modules, marks, edges))
            if kind == "mark":
                marks.add(site)
                covered.update(self._mark_points[site])
            elif kind in ("start", "end"):  # one hook of a module: a call's start or its end
                edges.add((kind, site))
                covered.update(self._edge_points[kind, site])
            else:
                windows.add(site)
                modules |= self._window_modules({site})
                hooked = self._hooked_packs(windows)
                covered = self._covered(hooked, modules, marks, edges)
        return Installed(windows=frozenset(windows), modules=frozenset(modules), marks=frozenset(marks),
                         starts=frozenset(m for k, m in edges if k == "start" and m not in modules),
                         ends=frozenset(m for k, m in edges if k == "end" and m not in modules), hooked_packs=hooked)

    def _outermost(self, windows: set) -> set:
        """`windows` less those inside another (a window sees every pack of the calls within it: an inner
        one would add only its module's hook calls; the whole step's holds every other)."""
        if WHOLE_STEP in windows:
            return {WHOLE_STEP}
        calls, out, reach = self.trace.calls, set(), -1
        for c in sorted(windows, key=lambda c: (calls[c].first_op, -calls[c].end_op, c)):
            if calls[c].end_op > reach:
                out.add(c)
                reach = calls[c].end_op
        return out

    def _window_modules(self, windows) -> set:
        """The modules whose hooks open and close `windows`."""
        return {self.trace.calls[c].module for c in windows if c != WHOLE_STEP}

    def firings(self, sites: Installed) -> np.ndarray:
        """Per op, how many times the installed hooks call Python there (a point p charged at op p,
        the end at the last op)."""
        n = max(self.n_ops, 1)
        at = [self.packed_at[sites.hooked_packs], self.unpacked_at[sites.hooked_packs & (self.unpacked_at >= 0)]]
        at += [self._module_array[m] for m in sites.modules if m in self._module_array]
        at += [self._edge_array[k, m] for k, paths in (("start", sites.starts), ("end", sites.ends)) for m in paths]
        at += [self._mark_array[k] for k in sites.marks]
        return _per_op(at, n)

    def stretches(self, sites: Installed) -> np.ndarray:
        """Per op, the stretches of the optimizer's step the installed update marks split off there (each
        one more call of the step: memplan.tracing.stepwise)."""
        return _per_op([self._mark_array["update", key] for key in sites.updates], max(self.n_ops, 1))

    def _hooked_packs(self, windows) -> np.ndarray:
        """bool per pack: saved inside one of `windows`."""
        saved = len(self.trace.saved)
        if WHOLE_STEP in windows:
            return np.ones(saved, dtype=np.bool_)
        delta = np.zeros(saved + 1, dtype=np.int64)
        for c in windows:
            call = self.trace.calls[c]
            delta[call.first_saved] += 1
            delta[call.end_saved] -= 1
        return np.cumsum(delta[:-1]) > 0

    def _covered(self, hooked: np.ndarray, modules, marks, edges=()) -> set:
        """The points some installed site fires at."""
        out = {0, self.n_ops, *self.packed_at[hooked].tolist(), *self.unpacked_at[hooked].tolist()}
        for m in modules:
            out.update(self._module_points.get(m, ()))
        for e in edges:
            out.update(self._edge_points[e])
        for k in marks:
            out.update(self._mark_points[k])
        return out

    def _price(self, candidate, windows, modules, marks, edges=()) -> int:
        """Hook calls a step makes for `candidate` beyond those installed already."""
        kind, site = candidate
        if kind == "mark":
            return 0 if site in marks else len(self._mark_points[site]) * _calls_per_firing(site)
        if kind in ("start", "end"):
            return 0 if site in modules or candidate in edges else len(self._edge_points[candidate])
        call = self.trace.calls[site] if site != WHOLE_STEP else None
        packs = len(self.trace.saved) if call is None else call.end_saved - call.first_saved
        module = 0 if call is None or call.module in modules else len(self._module_points[call.module])
        return 0 if site in windows else 2 * packs + module

    def _sites_by_point(self) -> dict[int, list[tuple[str, object]]]:
        """Per point, the sites that fire there: marks, a module's start or end hook (a call starts or
        ends), windows (a pack or an unpack inside them)."""
        out: dict[int, list] = {}
        for m in self.trace.marks:
            out.setdefault(m.point, []).append(("mark", (m.kind, m.key)))
        for c in self.trace.calls:
            out.setdefault(c.first_op, []).append(("start", c.module))
            out.setdefault(c.end_op, []).append(("end", c.module))
        for k in range(len(self.trace.saved)):
            for p in (int(self.packed_at[k]), int(self.unpacked_at[k])):
                if p >= 0:
                    out.setdefault(p, []).append(("window", int(self.window_of[k])))
        return {p: list(dict.fromkeys(sites)) for p, sites in out.items()}


def _calls_per_firing(mark: tuple[str, str]) -> int:
    """Python calls a firing of `mark` (kind, key) makes, to choose among sites: a parameter's update also
    begins a stretch of the optimizer's step, one more call of its step (memplan.tracing.stepwise)."""
    return 2 if mark[0] == "update" else 1


def _per_op(points: list[np.ndarray], n: int) -> np.ndarray:
    """How many of `points` fall at each of `n` ops (a point p at op p, the end at the last op)."""
    return np.bincount(np.minimum(np.concatenate([np.zeros(0, dtype=np.int64), *points]), n - 1), minlength=n)


def without_updates(trace):
    """`trace` without the marks inside its optimizer's step: the sites of a step run whole."""
    return replace(trace, marks=tuple(m for m in trace.marks if m.kind != "update"))


def _ints(values) -> list[int]:
    """`values` (an array or an iterable of integers) as Python ints."""
    return values.tolist() if isinstance(values, np.ndarray) else [int(v) for v in values]


def _innermost_calls(calls, n_saved: int) -> np.ndarray:
    """Per pack, the smallest module call it was saved in (WHOLE_STEP: none)."""
    out = np.full(n_saved, WHOLE_STEP, dtype=np.int64)
    for c, call in sorted(enumerate(calls), key=lambda cc: cc[1].first_saved - cc[1].end_saved):  # largest first
        out[call.first_saved:call.end_saved] = c
    return out
