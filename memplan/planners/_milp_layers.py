"""The layer view the `milp` planner decides on (paper 004's granularity).

Decision units are the feature maps: activations a forward layer makes and backward reads
again, one tensor each (HOME's policy vector), at least `min_bytes` large and with at least
one op between their last forward access and their first backward access (the gap they can
leave for). Time and memory are tracked at positions: the first op of every layer of
`Trace.layers`, plus the ops where a feature map can leave (out_after + 1) and must be back
(back_before). Between two positions nothing a plan decides changes, so a segment is
summed (its ops' durations) and maxed (its load).

A recompute of feature map x before op p replays x's writers (`Trace.lineage`); an input
of those ops that is not resident at p must be rebuilt first: a storage the framework has
already freed is always rebuilt ("forced"), a feature map whose own gap covers p is rebuilt
only when it is itself recomputed away (kept: resident; swapped: the plan is invalid). The
closure of these rebuilds at p is a small DAG (`Rebuild`) the MILP puts variables on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cost.model import Cost
from ..model import Trace

MAX_DEPTH = 64  # rebuilds nested deeper than this are refused (the simulator does not follow them either)


@dataclass(frozen=True, kw_only=True)
class FeatureMap:
    """One decision unit: a saved activation and its gap."""

    storage: int  # storage id
    nbytes: int  # its size
    out_after: int  # the last op touching it before its first backward access
    back_before: int  # its first backward access
    d2h_s: float  # seconds to copy it to the host
    h2d_s: float  # seconds to copy it back


@dataclass(frozen=True, kw_only=True)
class Node:
    """A storage a recomputation at one op may have to rebuild."""

    storage: int  # storage id
    unit: int | None  # its feature map index when rebuilding it depends on the decision; None: forced
    ops: tuple[int, ...]  # the ops replayed to rebuild it
    nbytes: int  # its size
    rebuildable: bool  # False when its writers cannot be replayed there (no producer, overwritten input, too deep)
    children: tuple[int, ...] = ()  # node indices of the inputs it needs rebuilt first


@dataclass(frozen=True, kw_only=True)
class Rebuild:
    """Everything that recomputations before one op may replay."""

    op: int  # the op the recomputations run before
    targets: tuple[int, ...]  # feature maps whose gap ends here
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
    units: tuple[FeatureMap, ...]  # the feature maps
    rebuilds: dict  # op -> Rebuild, at every back_before of a feature map
    baseline_s: float  # the iteration with no plan
    peak_bytes: int  # its peak load

    def position_of(self, op: int) -> int:
        """Index of the position whose segment holds `op`."""
        return int(np.searchsorted(self.positions, op, side="right") - 1)


def layer_problem(trace: Trace, cost: Cost, min_bytes: int) -> LayerProblem:
    """The feature maps, positions and rebuild closures of `trace`.

    Args:
        trace: the iteration.
        cost: its op and copy times.
        min_bytes: feature maps smaller than this are kept.
    """
    units = feature_maps(trace, cost, min_bytes)
    positions = _positions(trace, units)
    n = len(trace.ops)
    prefix = np.concatenate([[0.0], np.cumsum(cost.durations)])
    ends = np.append(positions[1:], n)
    born = np.zeros(n + 1, dtype=np.int64)
    alive = trace.free_ops > trace.alloc_ops
    np.add.at(born, trace.alloc_ops[alive], trace.nbytes[alive])
    unit_of = {u.storage: k for k, u in enumerate(units)}
    rebuilds = {}
    for op in sorted({u.back_before for u in units}):
        targets = tuple(k for k, u in enumerate(units) if u.back_before == op)
        rebuilds[op] = _rebuild(trace, op, targets, units, unit_of)
    return LayerProblem(positions=positions, op_s=np.asarray(cost.durations, dtype=np.float64), seg_s=prefix[ends] - prefix[positions],
                        seg_load=np.maximum.reduceat(trace.load, positions), pre_load=trace.load[positions] - born[positions],
                        units=units, rebuilds=rebuilds, baseline_s=float(prefix[-1]), peak_bytes=trace.peak_load_bytes)


def feature_maps(trace: Trace, cost: Cost, min_bytes: int) -> tuple[FeatureMap, ...]:
    """Saved activations of at least `min_bytes` with a non-empty gap before backward, by id."""
    out = []
    for s in trace.storages:
        if s.kind != "activation" or s.persistent or s.nbytes < max(min_bytes, 1) or s.id in trace.engine_owned:
            continue
        accesses = trace.accesses[s.id]
        back = next((i for i in accesses if trace.ops[i].phase == "backward"), None)
        earlier = [i for i in accesses if i < back] if back is not None else []
        if not earlier or back - earlier[-1] < 2:
            continue
        out.append(FeatureMap(storage=s.id, nbytes=s.nbytes, out_after=earlier[-1], back_before=back,
                              d2h_s=float(cost.d2h_s(s.nbytes)), h2d_s=float(cost.h2d_s(s.nbytes))))
    return tuple(out)


def _positions(trace: Trace, units) -> np.ndarray:
    starts = {0} | {layer.ops[0] for layer in trace.layers}
    starts |= {u.out_after + 1 for u in units} | {u.back_before for u in units}
    return np.array(sorted(starts), dtype=np.int64)


# --- recompute closures --------------------------------------------------------------------------


def _rebuild(trace: Trace, op: int, targets, units, unit_of: dict) -> Rebuild:
    """The nodes a recomputation before `op` may rebuild, breadth-first from its targets."""
    nodes: list[dict] = []
    index: dict[int, int] = {}

    def add(sid: int, unit: int | None, depth: int) -> int:
        if sid not in index:
            index[sid] = len(nodes)
            ops = trace.lineage(sid, op)[0]
            rebuildable = bool(ops) and trace.recomputable(sid) and depth < MAX_DEPTH \
                and not overwritten_input(trace, sid, op)
            nodes.append({"storage": sid, "unit": unit, "ops": ops, "nbytes": int(trace.nbytes[sid]), "children": [],
                          "depth": depth, "rebuildable": rebuildable})
        return index[sid]

    for k in targets:
        add(units[k].storage, k, 0)
    for node in nodes:  # grows while it is walked
        if not node["rebuildable"]:
            continue
        for r in trace.lineage(node["storage"], op)[1]:
            how = _needs(trace, r, op, units, unit_of)
            if how is not None:
                node["children"].append(add(r, how if how >= 0 else None, node["depth"] + 1))
    frozen = tuple(Node(**{k: (tuple(v) if k == "children" else v) for k, v in n.items() if k != "depth"})
                   for n in nodes)
    replayed = {j for n in frozen for j in n.ops}
    transient = {j: max(sum(int(trace.nbytes[w]) for w in set(trace.ops[j].writes) if w != n.storage)
                        for n in frozen if j in n.ops) for j in replayed}
    reads = frozenset(r for j in replayed for r in trace.ops[j].reads)
    return Rebuild(op=op, targets=tuple(targets), nodes=frozen, transient=transient, reads=reads)


def _needs(trace: Trace, sid: int, op: int, units, unit_of: dict) -> int | None:
    """How input `sid` of a replay before `op` is found: None resident, -1 rebuilt (freed by the
    framework), k >= 0 rebuilt when feature map k is recomputed away then."""
    s = trace.storages[sid]
    if not s.alloc_op <= op < s.free_op:
        return -1
    k = unit_of.get(sid)
    if k is not None and units[k].out_after < op < units[k].back_before:
        return k
    return None


def overwritten_input(trace: Trace, sid: int, op: int) -> bool:
    """True when an op replayed to rebuild `sid` before `op` reads a storage written again
    between it and `op` (the replay would read the new value)."""
    for j in trace.lineage(sid, op)[0]:
        for r in trace.ops[j].reads:
            if r != sid and any(j < w < op for w in trace.writers[r]):
                return True
    return False
