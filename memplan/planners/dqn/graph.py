"""The operation graph of paper 002 §4.2-4.4: one node per op, the six node features, the action nodes.

Nodes are the trace's ops. Edges join consecutive ops and consecutive accesses of one
storage (ops that share a variable), weighted by the time lag between the two ops in
the unconstrained run; every node is also its own neighbour (weight 0).

Actions (§4.5, §4.9): node 0 stands for "do nothing"; every other node stands for at
most one action, "offload" or "remove" (drop for recomputation) of one saved activation.
Which node: offload at the activation's last forward access (the op that reads it last,
as in Fig. 4), remove at its producer; a node already taken passes the action to the
next free node (larger activations choose first). An activation whose recomputation
cannot run even with nothing else decided has no remove node.

Node features (§4.4.1), normalised so that one network serves traces and budgets of any
size: (0) the size of the node's variable over the memory still to take away (the
largest excess of the planned load over the limit), clipped; (1) its swap time, (2) its
recompute time (the ops that wrote it) and (3) how soon it is revisited, each as
log1p(t / mean op time) / 8; (4) the node's action type (0 none, 0.5 offload, 1 remove);
(5) whether the action is valid now. The node's variable is the action's activation for
an action node, revisited at its first backward use, timed from the node under
execution; else the largest storage the op writes (or reads), revisited at its next
access after the op. Features (0), (3) of action nodes and (5) change as the agent acts
and moves (`Graph.state_features`); the rest are fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...cost.model import Cost
from ...model import Action, Trace
from ..kit.ops import op_starts
from ..kit.rebuild import Rebuilder
from ..kit.saved import SavedGap, saved_gaps

NOTHING_NODE = 0  # the node that stands for "do nothing"
N_FEATURES = 6
VALID = 5  # column of the dynamic feature
SIZE_CLIP = 4.0  # a variable this many times the memory to save is as good as any larger one
LOG_SCALE = 8.0  # log1p of a time in mean op times, divided by this, stays about within [0, 1]
MIN_DEFICIT = 1  # bytes, so a budget at the peak does not divide by zero


@dataclass(frozen=True, kw_only=True, eq=False)
class Graph:
    """One (trace, device, budget) as the agent sees it."""

    trace: Trace  # the iteration
    cost: Cost  # its op and copy times
    budget_bytes: int  # the memory limit
    gaps: tuple[SavedGap, ...]  # the candidate activations (index k)
    offload_node: np.ndarray  # node of "offload gap k" (-1: none) (int64, per candidate)
    remove_node: np.ndarray  # node of "remove gap k" (-1: none) (int64, per candidate)
    node_kind: np.ndarray  # Action.KEEP, Action.SWAP or Action.RECOMPUTE per node (int64)
    node_gap: np.ndarray  # candidate index of an action node, -1 otherwise (int64)
    features: np.ndarray  # (nodes, N_FEATURES) float32 before the first action (VALID column zero)
    node_bytes: np.ndarray  # size of each node's variable (float64, 0 when it has none)
    reuse_s: np.ndarray  # an action node's variable's next use (unconstrained start time; NaN elsewhere)
    starts: np.ndarray  # unconstrained start time of every op, and the end (float64, nodes + 1)
    tau: float  # mean op time, the unit of the time features
    edges: np.ndarray  # (edges, 2) int64 node pairs, both directions and self loops
    edge_weight: np.ndarray  # normalised time lag per edge (float32)

    @property
    def num_nodes(self) -> int:
        """Number of nodes (ops)."""
        return len(self.trace.ops)

    def state_features(self, current: int, valid: np.ndarray, deficit_bytes: int) -> np.ndarray:
        """The node features (nodes, 6) when the agent is at node `current`, with `valid` actions and
        `deficit_bytes` still to take away (the largest excess of the planned load over the limit)."""
        x = self.features.copy()
        x[:, 0] = np.minimum(self.node_bytes / max(deficit_bytes, MIN_DEFICIT), SIZE_CLIP)
        action = ~np.isnan(self.reuse_s)
        x[action, 3] = _log_time(np.maximum(self.reuse_s[action] - self.starts[current], 0.0), self.tau)
        x[:, VALID] = valid
        return x


def build_graph(trace: Trace, cost: Cost, budget_bytes: int, min_bytes: int = 0) -> Graph:
    """The graph of `trace` under `budget_bytes`, with candidates of at least `min_bytes`."""
    gaps = tuple(saved_gaps(trace, min_bytes))
    removable = _removable(trace, gaps)
    offload_node, remove_node, kind, gap_of = _assign_actions(trace, gaps, removable)
    starts = op_starts(cost)
    tau = max(float(starts[-1]) / max(len(trace.ops), 1), 1e-12)
    variables = [_variable(trace, gaps, gap_of, v) for v in range(len(trace.ops))]
    node_bytes = np.array([0.0 if sid is None else float(trace.nbytes[sid]) for sid, _ in variables])
    reuse = np.full(len(trace.ops), np.nan)
    reuse[gap_of >= 0] = starts[[gaps[k].back_before for k in gap_of[gap_of >= 0]]]
    features = _features(trace, cost, variables, kind, starts, tau, max(trace.peak_load_bytes - budget_bytes, 0))
    edges = _edges(trace)
    lag = np.abs(starts[edges[:, 0]] - starts[edges[:, 1]])
    return Graph(trace=trace, cost=cost, budget_bytes=budget_bytes, gaps=gaps, offload_node=offload_node,
                 remove_node=remove_node, node_kind=kind, node_gap=gap_of, features=features,
                 node_bytes=node_bytes, reuse_s=reuse, starts=starts, tau=tau, edges=edges,
                 edge_weight=_log_time(lag, tau).astype(np.float32))


def _removable(trace: Trace, gaps) -> list[bool]:
    """Per candidate: its recomputation before its first backward use can run with nothing else away."""
    rebuilder = Rebuilder(trace)
    return [rebuilder.rebuild(g.storage, g.back_before) is not None for g in gaps]


def _assign_actions(trace: Trace, gaps, removable) -> tuple[np.ndarray, ...]:
    n = len(trace.ops)
    kind = np.full(n, Action.KEEP, dtype=np.int64)
    gap_of = np.full(n, -1, dtype=np.int64)
    nodes = {action: np.full(len(gaps), -1, dtype=np.int64) for action in (Action.SWAP, Action.RECOMPUTE)}
    taken = np.zeros(n, dtype=bool)
    taken[NOTHING_NODE] = True
    for k in sorted(range(len(gaps)), key=lambda k: (-gaps[k].nbytes, gaps[k].storage)):
        wanted = [(Action.SWAP, gaps[k].last_forward)]
        if removable[k]:
            wanted.append((Action.RECOMPUTE, trace.producer(gaps[k].storage)))
        for action, preferred in wanted:
            node = _free_node(taken, preferred)
            if node >= 0:
                taken[node], kind[node], gap_of[node], nodes[action][k] = True, action, k, node
    return nodes[Action.SWAP], nodes[Action.RECOMPUTE], kind, gap_of


def _free_node(taken: np.ndarray, preferred: int) -> int:
    """The first free node at or after `preferred`, wrapping around; -1 when none is left."""
    free = np.flatnonzero(~np.roll(taken, -preferred))
    return int((free[0] + preferred) % len(taken)) if free.size else -1


def _features(trace: Trace, cost: Cost, variables, kind, starts, tau: float, deficit: int) -> np.ndarray:
    """The features before the first action (what is still to save: the whole excess of the peak)."""
    out = np.zeros((len(trace.ops), N_FEATURES), dtype=np.float32)
    for v, (sid, since) in enumerate(variables):
        if sid is None:
            continue
        size = int(trace.nbytes[sid])
        nxt = next((i for i in trace.accesses[sid] if i > since), None)
        writers = [j for j in trace.writers[sid] if nxt is None or j < nxt]
        out[v, 0] = min(size / max(deficit, MIN_DEFICIT), SIZE_CLIP)
        out[v, 1] = _log_time(cost.d2h_s(size), tau)
        out[v, 2] = _log_time(float(cost.durations[writers].sum()) if writers else 0.0, tau)
        out[v, 3] = _log_time(starts[nxt] - starts[since], tau) if nxt is not None else 0.0
    out[:, 4] = kind / 2.0
    return out


def _variable(trace: Trace, gaps, gap_of, v: int) -> tuple[int | None, int]:
    """(storage of node v's variable, the op from which its revisit is timed): an action node's
    activation from its last forward access (wherever the node is), else the op's own."""
    if gap_of[v] >= 0:
        gap = gaps[gap_of[v]]
        return gap.storage, gap.last_forward
    op = trace.ops[v]
    touched = op.writes or op.reads
    if not touched:
        return None, v
    return max(touched, key=lambda s: (trace.nbytes[s], -s)), v


def _edges(trace: Trace) -> np.ndarray:
    """Consecutive ops, consecutive accesses of each storage and self loops, both directions, unique."""
    n = len(trace.ops)
    pairs = [np.stack([np.arange(n - 1), np.arange(1, n)], axis=1)] if n > 1 else []
    for accesses in trace.accesses:
        if len(accesses) > 1:
            a = np.asarray(accesses, dtype=np.int64)
            pairs.append(np.stack([a[:-1], a[1:]], axis=1))
    one_way = np.concatenate(pairs) if pairs else np.zeros((0, 2), dtype=np.int64)
    both = np.concatenate([one_way, one_way[:, ::-1], np.stack([np.arange(n)] * 2, axis=1)])
    return np.unique(both, axis=0)


def _log_time(seconds, tau: float):
    """A time as log1p(seconds / tau) / LOG_SCALE."""
    return np.log1p(np.asarray(seconds, dtype=np.float64) / tau) / LOG_SCALE
