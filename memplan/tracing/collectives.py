"""Which traced ops are collectives, what each does and how many bytes it moves.

The payload is the size of the whole collective buffer, as NCCL's tests count it: an
all-gather's gathered output, a reduce-scatter's unreduced input, an all-reduce's (or a
broadcast's) buffer. It is the largest storage the op touches (the other side of an
all-gather or reduce-scatter is the 1/world_size shard).
"""

from __future__ import annotations

from ..model import Trace

# c10d ops as the dispatcher names them (torch.distributed's in-place ops and the functional ones).
COLLECTIVE_KINDS = {
    "c10d._allgather_base_.default": "all_gather",
    "c10d.allgather_.default": "all_gather",
    "c10d.allgather_into_tensor_coalesced_.default": "all_gather",
    "_c10d_functional.all_gather_into_tensor.default": "all_gather",
    "c10d._reduce_scatter_base_.default": "reduce_scatter",
    "c10d.reduce_scatter_.default": "reduce_scatter",
    "c10d.reduce_scatter_tensor_coalesced_.default": "reduce_scatter",
    "_c10d_functional.reduce_scatter_tensor.default": "reduce_scatter",
    "c10d.allreduce_.default": "all_reduce",
    "c10d.allreduce_coalesced_.default": "all_reduce",
    "_c10d_functional.all_reduce.default": "all_reduce",
    "_c10d_functional.all_reduce_.default": "all_reduce",
    "c10d.broadcast_.default": "broadcast",
    "_c10d_functional.broadcast.default": "broadcast",
}


def collective_kind(op_name: str) -> str | None:
    """"all_gather", "reduce_scatter", "all_reduce" or "broadcast" for a collective op, else None."""
    return COLLECTIVE_KINDS.get(op_name)


def payload_bytes(trace: Trace, op) -> int:
    """Bytes of the collective's whole buffer (see the module docstring)."""
    return max((trace.storages[sid].nbytes for sid in op.reads + op.writes), default=0)


def collective_records(trace: Trace) -> list[dict]:
    """One record per collective op: {"op", "kind", "phase", "bytes"}, in program order."""
    return [{"op": op.index, "kind": kind, "phase": op.phase, "bytes": payload_bytes(trace, op)}
            for op in trace.ops if (kind := collective_kind(op.name)) is not None]


def collective_totals(trace: Trace) -> dict[str, dict[str, int]]:
    """Per collective kind: how many ran and their payload bytes in all."""
    out: dict[str, dict[str, int]] = {}
    for record in collective_records(trace):
        entry = out.setdefault(record["kind"], {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += record["bytes"]
    return out
