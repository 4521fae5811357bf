"""The validator's memory rules: the pool layout (when the plan has one) and the budget.

Part of the independent validator (memplan.sim.validate): it shares no code with the
simulator. The budget is checked on the static load (`static_load`), a lower bound on the
load any schedule of the plan reaches.
"""

from __future__ import annotations

import numpy as np

from ..model import Decision, Plan, Trace
from ..units import format_bytes
from .violations import (BAD_CONV_DECISION, OVER_BUDGET, POOL_MISSING_SLOT, POOL_OUT_OF_RANGE, POOL_OVER_BUDGET,
                         POOL_OVERLAP, POOL_STRAY_SLOT, Violation)


# --- pool -------------------------------------------------------------------------------------


def residency_intervals(trace: Trace, sid: int, decisions: list[Decision]) -> list[tuple[int, int]]:
    """Half-open op ranges [start, end) during which storage `sid` occupies device memory.

    With decisions sorted by out_after: [alloc_op, d1.out_after+1), [d1.prefetch_at,
    d2.out_after+1), ..., [dk.prefetch_at, free_op); a wrap-around gap makes the span from
    its prefetch to the first release one interval, split at the iteration boundary.

    Args:
        trace: the trace.
        sid: the storage id.
        decisions: its decisions, valid and sorted by out_after.
    Returns:
        The non-empty intervals, in op order of their start.
    """
    s, n = trace.storages[sid], trace.num_steps
    wrap = next((d for d in decisions if d.wraps), None)
    plain = [d for d in decisions if not d.wraps]
    starts = [s.alloc_op] + [d.prefetch_at for d in plain]
    ends = [d.out_after + 1 for d in plain] + [s.free_op]
    if wrap is not None:
        starts[0], ends[-1] = wrap.prefetch_at, wrap.out_after + 1
        if wrap.prefetch_at > wrap.out_after:  # prefetched before the boundary: split there
            starts[0] = 0
            starts.append(wrap.prefetch_at)
            ends.append(n)
    return sorted((a, b) for a, b in zip(starts, ends) if a < b)


def pooled_intervals(trace: Trace, sid: int, decisions: list[Decision], slots: dict) -> list[tuple[int, int]]:
    """`residency_intervals`, and where the plan's pool holds storage `sid` at the step's start for a
    swap-out after the step's last op (copied, and released, in the next step: memplan.sim.program's
    carried copies), that head: [0, 1), the op it surely holds its bytes at (its release lies at an op
    the program's timing decides, which this timing-free check does not know)."""
    intervals = residency_intervals(trace, sid, decisions)
    carried = any(d.wraps and d.out_after == trace.num_steps - 1 for d in decisions)
    if carried and (sid, 0) in slots and all(a > 0 for a, _ in intervals):
        return [(0, 1), *intervals]
    return intervals


def check_pool(trace: Trace, plan: Plan, by_storage: dict[int, list[Decision]], out: list[Violation]) -> None:
    slots = {(p.storage, p.start): p.offset for p in plan.pool}
    spans: list[tuple[int, int, int, int, int]] = []  # (start, end, offset, nbytes, storage)
    for s in trace.storages:
        if s.nbytes == 0:
            continue
        for start, end in pooled_intervals(trace, s.id, by_storage.get(s.id, []), slots):
            offset = slots.pop((s.id, start), None)
            if offset is None:
                out.append(Violation(kind=POOL_MISSING_SLOT, storage=s.id, op=start,
                                     message=f"storage {s.id} resident from op {start} has no pool slot"))
                continue
            spans.append((start, end, offset, s.nbytes, s.id))
            _check_range(plan.pool_bytes, s.id, start, offset, s.nbytes, out)
    for (sid, start), _ in sorted(slots.items()):
        out.append(Violation(kind=POOL_STRAY_SLOT, storage=sid, op=start,
                             message=f"pool slot for storage {sid} at op {start} matches no residency interval"))
    _check_slot_overlaps(spans, out)


def _check_range(pool_bytes: int | None, sid: int, start: int, offset: int, nbytes: int,
                 out: list[Violation]) -> None:
    if offset < 0 or (pool_bytes is not None and offset + nbytes > pool_bytes):
        out.append(Violation(kind=POOL_OUT_OF_RANGE, storage=sid, op=start,
                             message=f"storage {sid} at op {start}: slot [{offset}, {offset + nbytes}) is "
                                     f"outside the pool of {pool_bytes} bytes"))


def _check_slot_overlaps(spans: list[tuple[int, int, int, int, int]], out: list[Violation]) -> None:
    """At every interval start, sort the live slots by offset: any overlap shows between neighbours."""
    if not spans:
        return
    arr = np.array(spans, dtype=np.int64)
    seen: set[tuple[int, int]] = set()
    for t in np.unique(arr[:, 0]):
        live = arr[(arr[:, 0] <= t) & (t < arr[:, 1])]
        live = live[np.lexsort((live[:, 2] + live[:, 3], live[:, 2]))]
        clash = np.nonzero(live[:-1, 2] + live[:-1, 3] > live[1:, 2])[0]
        for i in clash:
            a, b = live[i], live[i + 1]
            pair = (int(min(a[4], b[4])), int(max(a[4], b[4])))
            if pair in seen:
                continue
            seen.add(pair)
            out.append(Violation(kind=POOL_OVERLAP, storage=int(b[4]), op=int(t),
                                 message=f"at op {int(t)} storages {int(a[4])} [{a[2]}, {a[2] + a[3]}) and "
                                         f"{int(b[4])} [{b[2]}, {b[2] + b[3]}) share pool bytes"))


# --- budget -----------------------------------------------------------------------------------


def static_load(trace: Trace, decisions: list[Decision]) -> np.ndarray:
    """Bytes resident while each op runs under `decisions`, copies and recomputes taking no time.

    A storage is released right after out_after and allocated again at its prefetch op
    (swap) or back_before (recompute): a lower bound on the load any schedule reaches.

    Args:
        trace: the trace.
        decisions: structurally valid decisions.
    Returns:
        An int64 array of length `trace.num_steps`.
    """
    n = trace.num_steps
    count = len(decisions)
    # Read as columns (searches score thousands of plans by it); a gap across the iteration boundary
    # released until a prefetch before its release is split at the iteration's end (Decision.away_ranges).
    sid = np.fromiter((d.storage for d in decisions), dtype=np.int64, count=count)
    start = np.fromiter((d.out_after for d in decisions), dtype=np.int64, count=count) + 1
    end = np.fromiter((d.prefetch_at for d in decisions), dtype=np.int64, count=count)
    wraps = np.fromiter((d.wraps for d in decisions), dtype=np.bool_, count=count)
    split = wraps & (start > end)
    nbytes = trace.nbytes[sid]
    lo = np.concatenate([np.where(split, 0, start), start[split]])
    hi = np.concatenate([end, np.full(int(split.sum()), n, dtype=np.int64)])
    size = np.concatenate([nbytes, nbytes[split]])
    away = lo < hi
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, lo[away], -size[away])
    np.add.at(delta, hi[away], size[away])
    return trace.load + np.cumsum(delta)[:n]


def check_pool_budget(pool_bytes: int | None, budget_bytes: int, out: list[Violation]) -> None:
    if pool_bytes is not None and pool_bytes > budget_bytes:
        out.append(Violation(kind=POOL_OVER_BUDGET, storage=None, op=None,
                             message=f"the pool needs {format_bytes(pool_bytes)} ({pool_bytes} bytes), over the "
                                     f"budget of {format_bytes(budget_bytes)} ({budget_bytes} bytes)"))


def conv_temps(trace: Trace, microbatches, out: list[Violation]) -> np.ndarray:
    """Temporary bytes per op of the well-formed conv decisions; the others become violations."""
    temps = np.zeros(trace.num_steps, dtype=np.int64)
    kernels: dict[int, list[str]] = {}
    for m in microbatches:
        conv = trace.ops[m.op].conv if 0 <= m.op < len(trace.ops) else None
        if conv is None or m.kernel not in conv.kernels or sum(m.sizes) != conv.n:
            out.append(Violation(kind=BAD_CONV_DECISION, storage=None, op=m.op,
                                 message=f"op {m.op} has no {m.kernel} kernel of batch {sum(m.sizes)}"))
            continue
        kernels.setdefault(m.op, []).append(m.kernel)
        temps[m.op] = max(int(temps[m.op]), m.workspace_bytes + m.accumulator_bytes)
    for op, decided in kernels.items():
        if sorted(decided) != sorted(trace.ops[op].conv.kernels):
            out.append(Violation(kind=BAD_CONV_DECISION, storage=None, op=op,
                                 message=f"op {op} runs {trace.ops[op].conv.kernels}, the plan decides {decided}"))
    return temps


def check_budget(trace: Trace, good: list[Decision], budget_bytes: int, out: list[Violation],
                  temps: np.ndarray) -> None:
    if not trace.num_steps:
        return
    load = static_load(trace, good) + temps
    over = np.nonzero(load > budget_bytes)[0]
    if over.size:
        op = int(over[0])
        out.append(Violation(kind=OVER_BUDGET, storage=None, op=op,
                             message=f"static load at op {op} is {format_bytes(int(load[op]))} "
                                     f"({int(load[op])} bytes), over the budget of {format_bytes(budget_bytes)} "
                                     f"({budget_bytes} bytes); peak static load {int(load.max())} bytes"))
