"""The units and positions the `milp` planner decides on (paper 004's layer granularity,
over every storage that can move, as AutoSwap moves them).

Decision units are gaps: the ops strictly between two consecutive accesses of one storage
(`memplan.planners.kit.candidates.find_candidates` with every gap of every storage), and for
a storage alive across the iteration (weights, optimizer state) the wrap-around gap from its
last access to its first one in the next iteration. A unit is at least `min_bytes` large and,
when a budget is given, spans an op whose unplanned load is over it (leaving elsewhere cannot
lower the peak and only costs link time). Every unit may be swapped; a unit that does not wrap
may be recomputed when its storage can be rebuilt (`Trace.recomputable`).

A recomputation before op p reads the inputs of the ops it replays; an input swapped away at p
may be brought back for it: every swappable unit of an input of a target's own writers whose
gap covers p gets a variant ending at p (deeper inputs of the closure are not: they stay
resident or are rebuilt) (its `group` names the unit it shortens; at most one unit of a group is
chosen). A wrap-around gap whose storage's last access is not the step's last op gets a variant
leaving after the last op (`Unit.carried`): its copy out then runs at the next step's start,
where the device-to-host lane is idle, instead of in the step's tail. Time and memory are
tracked at positions: the first op of every layer of `Trace.layers`, plus the ops where a unit
can leave (out_after + 1) and must be back (back_before). Between two positions nothing a plan
decides changes, so a segment is summed (its ops' durations) and maxed (its load).

A recompute of unit x before op p replays x's writers (`Trace.lineage`); an input of those ops
that is not resident at p must be rebuilt first: a storage the framework has already freed is
always rebuilt ("forced"), one with a unit whose gap covers p is rebuilt only when that unit is
itself recomputed away (kept: resident; swapped: brought back by a variant ending at p). The
closure of these rebuilds at p is a small DAG (`Rebuild`) the MILP puts variables on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ...cost.model import Cost
from ...model import Trace
from ..kit.candidates import find_candidates
from ..kit.gaps import alive_at, gap_covers
from ..kit.ops import op_starts
from ..kit.replayable import input_overwritten
from ..kit.saved import saved_gaps

MAX_DEPTH = 64  # rebuilds nested deeper than this are refused (the simulator does not follow them either)
MOVES = ("all", "activations")  # what may move: every gap of every storage, or saved activations' only
ACTIVATIONS = "activations"


@dataclass(frozen=True, kw_only=True)
class Unit:
    """One decision unit: a storage and one gap it may leave device memory for."""

    storage: int  # storage id
    nbytes: int  # its size
    out_after: int  # the last op touching it before the gap
    back_before: int  # the op it must be back for (wraps around when <= out_after)
    d2h_s: float  # seconds to copy it to the host
    h2d_s: float  # seconds to copy it back
    group: int  # index of the unit it is a variant of (itself for a whole gap); one of a group is chosen
    recomputable: bool  # it may be dropped and rebuilt before back_before
    carried: bool = False  # swapped, it leaves after the step's last op: its copy is carried over into the next
    # step, which starts with its bytes held until the copy is done (memplan.sim.simulate; not a captured step's)

    @property
    def wraps(self) -> bool:
        """True for a gap across the iteration boundary."""
        return self.back_before <= self.out_after

    def covers(self, op: int) -> bool:
        """True when the storage is away while `op` runs, should the unit leave."""
        return gap_covers(self.out_after, self.back_before, op)


@dataclass(frozen=True, kw_only=True)
class Node:
    """A storage a recomputation at one op may have to rebuild."""

    storage: int  # storage id
    unit: int | None  # the unit whose decision says whether it is away there; None: forced (freed)
    ops: tuple[int, ...]  # the ops replayed to rebuild it
    nbytes: int  # its size
    rebuildable: bool  # False when its writers cannot be replayed there (no producer, overwritten input, too deep)
    children: tuple[int, ...] = ()  # node indices of the inputs it needs rebuilt first


@dataclass(frozen=True, kw_only=True)
class Rebuild:
    """Everything that recomputations before one op may replay."""

    op: int  # the op the recomputations run before
    targets: tuple[int, ...]  # recomputable units whose gap ends here
    nodes: tuple[Node, ...]  # one per target first (in that order), then what they may need
    transient: dict = field(default_factory=dict)  # replayed op -> bytes of its other outputs, alive while it runs
    reads: frozenset = frozenset()  # every storage a replayed op reads


@dataclass(frozen=True, kw_only=True)
class LayerProblem:
    """A trace seen at layer granularity, with what every decision can change."""

    positions: np.ndarray  # op index of every position, ascending, starting at 0
    op_s: np.ndarray  # seconds of every op
    seg_s: np.ndarray  # seconds of the ops from each position up to the next
    seg_load: np.ndarray  # largest unplanned load over those ops (bytes)
    pre_load: np.ndarray  # load at each position before its op's new outputs exist (bytes)
    units: tuple[Unit, ...]  # whole gaps first (group == index), then the variants
    rebuilds: dict  # op -> Rebuild, at every back_before of a recomputable unit
    baseline_s: float  # the iteration with no plan
    peak_bytes: int  # its peak load
    moves: str = "all"  # what may move: one of MOVES

    def position_of(self, op: int) -> int:
        """Index of the position whose segment holds `op`."""
        return int(np.searchsorted(self.positions, op, side="right") - 1)

    def groups(self) -> dict[int, list[int]]:
        """Group (index of a whole-gap unit) -> the units of that group, the whole gap first."""
        out: dict[int, list[int]] = {}
        for k, u in enumerate(self.units):
            out.setdefault(u.group, []).append(k)
        return out

    def base_units(self) -> list[int]:
        """The whole-gap units (not the variants)."""
        return [k for k, u in enumerate(self.units) if u.group == k]


def layer_problem(trace: Trace, cost: Cost, min_bytes: int, budget_bytes: int | None = None,
                  moves: str = "all") -> LayerProblem:
    """The units, positions and rebuild closures of `trace`.

    Args:
        trace: the iteration.
        cost: its op and copy times.
        min_bytes: smaller storages stay resident.
        budget_bytes: with a budget, only gaps spanning an op over it are units.
        moves: "all" (every gap of every storage) or "activations" (only saved activations'
            gap from their last forward to their first backward access: the feature maps of
            HOME, a smaller model).
    """
    base = whole_gaps(trace, cost, min_bytes, budget_bytes, moves)
    positions = _positions(trace, base)
    n = len(trace.ops)
    prefix = op_starts(cost)
    ends = np.append(positions[1:], n)
    born = np.zeros(n + 1, dtype=np.int64)
    alive = trace.free_ops > trace.alloc_ops
    np.add.at(born, trace.alloc_ops[alive], trace.nbytes[alive])
    units_of: dict[int, list[int]] = {}
    for k, u in enumerate(base):
        units_of.setdefault(u.storage, []).append(k)
    rebuilds = {}
    for op in sorted({u.back_before for u in base if u.recomputable}):
        targets = tuple(k for k, u in enumerate(base) if u.recomputable and u.back_before == op)
        rebuilds[op] = _rebuild(trace, op, targets, base, units_of)
    units = base + _early_variants(base, rebuilds, units_of) + _carried_variants(base, n, cost)
    return LayerProblem(positions=positions, op_s=np.asarray(cost.durations, dtype=np.float64),
                        seg_s=prefix[ends] - prefix[positions], seg_load=np.maximum.reduceat(trace.load, positions),
                        pre_load=trace.load[positions] - born[positions], units=tuple(units), rebuilds=rebuilds,
                        baseline_s=float(prefix[-1]), peak_bytes=trace.peak_load_bytes, moves=moves)


def whole_gaps(trace: Trace, cost: Cost, min_bytes: int, budget_bytes: int | None = None,
               moves: str = "all") -> list[Unit]:
    """The whole-gap units of `layer_problem` (its arguments), one a decision group: how large its model is,
    without the rebuild closures and variants that take most of its making."""
    base = movable_gaps(trace, cost, min_bytes, budget_bytes)
    if moves != ACTIVATIONS:
        return base
    saved = {(g.storage, g.last_forward, g.back_before) for g in saved_gaps(trace, min_bytes)}
    kept = [u for u in base if (u.storage, u.out_after, u.back_before) in saved]
    return [replace(u, group=k) for k, u in enumerate(kept)]


def movable_gaps(trace: Trace, cost: Cost, min_bytes: int, budget_bytes: int | None = None) -> list[Unit]:
    """Every gap of every storage of at least `min_bytes` (wrap-around gaps of persistent ones
    included; storages a data-parallel engine owns excluded), spanning an op over the budget."""
    cand = find_candidates(trace, max(min_bytes, 1), multi_swap=True)
    over = np.ones(len(trace.ops), dtype=bool) if budget_bytes is None else trace.load > budget_bytes
    over_before = np.concatenate([[0], np.cumsum(over)])  # over-budget ops before each op
    owned = trace.engine_owned
    last = len(trace.ops) - 1
    out = []
    for sid, a, b, nbytes in zip(cand.storage.tolist(), cand.out_after.tolist(), cand.back_before.tolist(),
                                 cand.nbytes.tolist()):
        spanned = over_before[b] - over_before[a + 1] if b > a else \
            over_before[-1] - over_before[a + 1] + over_before[b]
        if sid in owned or spanned == 0:
            continue
        out.append(Unit(storage=sid, nbytes=nbytes, out_after=a, back_before=b, d2h_s=float(cost.d2h_s(nbytes)),
                        h2d_s=float(cost.h2d_s(nbytes)), group=len(out),
                        recomputable=b > a and trace.recomputable(sid),
                        carried=b <= a and a == last and not cost.captured))
    return out


def _early_variants(base: list[Unit], rebuilds: dict, units_of: dict) -> list[Unit]:
    """A variant ending at p of every swappable whole gap whose storage a replay before p reads."""
    out = []
    for op, rb in sorted(rebuilds.items()):
        for sid in sorted(_direct_reads(rb)):
            for k in units_of.get(sid, ()):
                u = base[k]
                if not u.wraps and u.covers(op):
                    out.append(Unit(storage=u.storage, nbytes=u.nbytes, out_after=u.out_after, back_before=op,
                                    d2h_s=u.d2h_s, h2d_s=u.h2d_s, group=k, recomputable=False))
    return out


def _carried_variants(base: list[Unit], n_ops: int, cost: Cost) -> list[Unit]:
    """A variant leaving after the step's last op of every wrap-around gap leaving earlier (none where
    the step is captured: a graph's replay waits for that copy at its end)."""
    if cost.captured:
        return []
    return [replace(u, out_after=n_ops - 1, group=k, carried=True) for k, u in enumerate(base)
            if u.wraps and u.out_after < n_ops - 1]


def _direct_reads(rb: Rebuild) -> set[int]:
    """The storages the children of the targets are: what a recomputation there reads first hand."""
    return {rb.nodes[c].storage for t in range(len(rb.targets)) for c in rb.nodes[t].children}


def _positions(trace: Trace, units) -> np.ndarray:
    n = len(trace.ops)
    starts = {0} | {layer.ops[0] for layer in trace.layers}
    starts |= {u.out_after + 1 for u in units if u.out_after + 1 < n} | {u.back_before for u in units}
    return np.array(sorted(starts), dtype=np.int64)


# --- recompute closures --------------------------------------------------------------------------


def _rebuild(trace: Trace, op: int, targets, units, units_of: dict) -> Rebuild:
    """The nodes a recomputation before `op` may rebuild, breadth-first from its targets."""
    nodes: list[dict] = []
    index: dict[int, int] = {}

    def add(sid: int, unit: int | None, depth: int) -> int:
        if sid not in index:
            index[sid] = len(nodes)
            ops = trace.lineage(sid, op)[0]
            rebuildable = bool(ops) and trace.recomputable(sid) and depth < MAX_DEPTH \
                and not input_overwritten(trace, sid, op)
            nodes.append({"storage": sid, "unit": unit, "ops": ops, "nbytes": int(trace.nbytes[sid]), "children": [],
                          "depth": depth, "rebuildable": rebuildable})
        return index[sid]

    for k in targets:
        add(units[k].storage, k, 0)
    for node in nodes:  # grows while it is walked
        if not node["rebuildable"]:
            continue
        for r in trace.lineage(node["storage"], op)[1]:
            how = _needs(trace, r, op, units, units_of)
            if how is not None:
                node["children"].append(add(r, how if how >= 0 else None, node["depth"] + 1))
    frozen = tuple(Node(**{k: (tuple(v) if k == "children" else v) for k, v in n.items() if k != "depth"})
                   for n in nodes)
    replayed = {j for n in frozen for j in n.ops}
    transient = {j: max(sum(int(trace.nbytes[w]) for w in set(trace.ops[j].writes) if w != n.storage)
                        for n in frozen if j in n.ops) for j in replayed}
    reads = frozenset(r for j in replayed for r in trace.ops[j].reads)
    return Rebuild(op=op, targets=tuple(targets), nodes=frozen, transient=transient, reads=reads)


def _needs(trace: Trace, sid: int, op: int, units, units_of: dict) -> int | None:
    """How input `sid` of a replay before `op` is found: None resident, -1 rebuilt (freed by the
    framework), k >= 0 depending on unit k, whose gap covers `op`."""
    if not alive_at(trace, sid, op):
        return -1
    return next((k for k in units_of.get(sid, ()) if units[k].covers(op)), None)

