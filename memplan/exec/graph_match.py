"""Which op of the trace each op of a compiled graph is: the map a lowered plan is carried by.

The trace records the step's ops as eager PyTorch dispatches them. AOTAutograd's joint graph
holds the same forward after functionalization and decomposition: an op of the trace is a run
of graph nodes that name it as their `original_aten` (native_layer_norm is var_mean, rsqrt, sub
and mul there), an in-place op is its out-of-place twin, a view is no work at all. So both
sides become a sequence of ops that write a tensor, named alike (`op_key`), and are aligned
as sequences (difflib's longest matching blocks), which survives an op inserted or missing on
either side. Where a block differs (the CPU's eager dropout is empty_like, bernoulli_, div_ and
mul; compiled, it is one native_dropout), the ops of equal length are paired in order, and
otherwise each graph op stands for the trace ops of that block whose result has its shape.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from ..model import Trace
from ..tracing.opinfo import OPTIONAL_OPS

FORWARD_TAG = "is_forward"  # AOTAutograd's partitioner_tag of a joint graph's forward nodes


@dataclass(frozen=True, kw_only=True)
class GraphOp:
    """One op of the trace as the joint graph holds it: a run of nodes with one original op."""

    key: str  # op_key of the original op
    shape: tuple[int, ...] | None  # shape of its last tensor (its result), where known
    nodes: tuple  # the torch.fx nodes of the run


def op_key(name: str) -> str:
    """An op's name with in-place and out-of-place forms made one ("aten.relu_.default" and
    "aten.relu.default" -> "aten.relu.default"), as functionalization makes them one."""
    namespace, _, rest = name.partition(".")
    op, dot, overload = rest.partition(".")
    return f"{namespace}.{op.rstrip('_') or op}{dot}{overload}"


def trace_ops(trace: Trace) -> list[int]:
    """The trace's forward ops that write a tensor, in order: the side the graph is matched to."""
    return [op.index for op in trace.ops
            if op.phase == "forward" and op.writes and op.name not in OPTIONAL_OPS]


def graph_ops(graph) -> list[GraphOp]:
    """The forward of an AOTAutograd joint graph as runs of nodes, one run per original op that
    computes (views, and nodes that name no original op, such as RNG seeds, are left out)."""
    runs: list[list] = []
    for node in graph.nodes:
        original = node.meta.get("original_aten") if node.op == "call_function" else None
        if original is None or node.meta.get("partitioner_tag") != FORWARD_TAG:
            continue
        last = runs[-1][-1] if runs else None
        if last is not None and str(last.meta.get("original_aten")) == str(original) and _same_call(last, node):
            runs[-1].append(node)
        else:
            runs.append([node])
    return [GraphOp(key=op_key(str(run[0].meta["original_aten"])), shape=_result_shape(run), nodes=tuple(run))
            for run in runs if not getattr(run[0].meta["original_aten"], "is_view", False)]


def align(trace: Trace, ops: list[int], graph: list[GraphOp]) -> dict[int, tuple[int, ...]]:
    """Graph op index -> the trace ops (indices into `trace.ops`) it stands for.

    Args:
        trace: the traced step.
        ops: its forward ops that write a tensor (`trace_ops`).
        graph: the joint graph's forward ops (`graph_ops`).
    """
    names = [op_key(trace.ops[i].name) for i in ops]
    matcher = difflib.SequenceMatcher(a=names, b=[g.key for g in graph], autojunk=False)
    out: dict[int, tuple[int, ...]] = {}
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            out.update({j1 + k: (ops[i1 + k],) for k in range(j2 - j1)})
        elif tag == "replace":
            for j in range(j1, j2):
                same = tuple(i for i in ops[i1:i2] if graph[j].shape in _shapes_of(trace, i))
                if same:
                    out[j] = same
    return out


def _same_call(a, b) -> bool:
    """Whether two nodes with one original op come from one call of it: autograd numbers every
    call (`seq_nr`); nodes a decomposition adds without a number belong to their neighbours."""
    x, y = a.meta.get("seq_nr"), b.meta.get("seq_nr")
    return x is None or y is None or x == y


def _result_shape(run: list) -> tuple[int, ...] | None:
    for node in reversed(run):
        val = node.meta.get("val")
        shape = getattr(val, "shape", None)
        if shape is not None:
            try:
                return tuple(int(d) for d in shape)
            except TypeError:  # a symbolic size: no shape to pair by
                return None
    return None


def _shapes_of(trace: Trace, op_index: int) -> set[tuple[int, ...]]:
    """The shapes of what op `op_index` writes (its results; an in-place op's target)."""
    return {tuple(s.shape) for s in (trace.storages[w] for w in trace.ops[op_index].writes) if s.shape is not None}
