"""The discrete-event simulator every planner is judged by.

Semantics (the contract of DESIGN.md, "Simulator semantics"):

- One compute stream runs the ops in trace order for `cost.durations`. Two copy engines,
  device-to-host and host-to-device, are each FIFO: a copy starts at max(its issue time,
  the end of the engine's previous copy) and takes `cost.d2h_s` / `cost.h2d_s` of its bytes.
- Memory load = resident storages plus buffers being copied. A storage is resident for ops
  [alloc_op, free_op): allocated when op alloc_op starts, released when op free_op-1 ends.
  The budget caps the load: an allocation waits (memory_stall_s) for swap-outs in flight to
  complete; when nothing pending can free enough, the plan is infeasible and the result
  names the op and the shortfall.
- Per op i, in order: (1) prefetches triggered at i allocate their bytes (waiting if needed)
  and enqueue their host-to-device copy; (2) recomputations needed by i allocate their
  storage and run their producer chain on the compute stream (recompute_s), rebuilding
  recomputed-away chain inputs first, held only for the chain; (3) op i's new outputs are
  allocated; (4) op i waits for its prefetches to land (prefetch_stall_s) and decompresses
  them; (5) op i runs; (6) storages whose lifetime ends are released, and swap-outs after
  op i start: compressed (a kernel on the compute stream) and enqueued on the
  device-to-host engine; their memory is released when the copy completes, or, if `sync`,
  the compute stream waits for it (sync_stall_s). Recompute decisions release at once.
- Wrap-around decisions (weights, optimizer state), steady state: with the trigger in the
  head [0, back_before] the storage starts the iteration on the host; with the trigger in
  the tail it starts resident and the tail prefetch (for the next iteration) holds its
  bytes until the end.
- The iteration ends when the compute stream finishes; overlap_s is the copy time hidden
  behind compute (copy busy time minus the stalls, at least 0).
"""

from __future__ import annotations

import numpy as np

from ..cost.model import Cost
from ..cost.profiles import DeviceProfile
from ..plan.model import Plan
from ..trace.model import Trace
from ..units import parse_budget
from . import _kernel as K
from .result import SimResult

UNLIMITED = np.iinfo(np.int64).max // 4
MAX_CHAIN_DEPTH = 64


def simulate(trace: Trace, plan: Plan | None = None, device: str | DeviceProfile = "h100",
             budget: str | int | None = None, cost: Cost | None = None, timeline: bool = False) -> SimResult:
    """Simulate one iteration of `trace` under `plan` and `budget`.

    Args:
        trace: the traced iteration.
        plan: the plan; None keeps everything resident.
        device: profile name, file or DeviceProfile (ignored when `cost` is given).
        budget: None (no cap), bytes, or a string such as "8GiB" or "60%" of the peak.
        cost: precomputed durations for this trace.
        timeline: also return the load timeline, op start times and stream lanes.
    Returns:
        The SimResult.
    """
    cost = cost or Cost.for_trace(trace, device)
    budget_bytes = None if budget is None else parse_budget(budget, trace.peak_load_bytes)
    return Simulator(trace, cost).run(plan, budget_bytes, timeline=timeline)


class Simulator:
    """A simulator bound to one trace and cost model: per-trace arrays are built once.

    Search planners create one and call `run` thousands of times.
    """

    def __init__(self, trace: Trace, cost: Cost):
        self.trace = trace
        self.cost = cost
        n = len(trace.ops)
        alive = trace.free_ops > trace.alloc_ops
        ids = np.arange(len(trace.storages))
        self._birth_ptr, self._birth_ids = _csr(trace.alloc_ops[alive], ids[alive], n)
        self._death_ptr, self._death_ids = _csr(trace.free_ops[alive] - 1, ids[alive], n)
        self._durations = np.ascontiguousarray(cost.durations, dtype=np.float64)
        self._prefix = np.concatenate([[0.0], np.cumsum(self._durations)])
        self._chains: dict[tuple[int, int], tuple[float, tuple[int, ...]]] = {}
        # Sequential sum, exactly as the kernel accumulates time: no plan gives time == baseline.
        self.baseline_time_s = float(self._prefix[-1])

    def run(self, plan: Plan | None = None, budget_bytes: int | None = None, timeline: bool = False) -> SimResult:
        """Simulate under `plan` with a cap of `budget_bytes` (None: no cap)."""
        arrays = self._plan_arrays(plan.decisions if plan else ())
        budget = UNLIMITED if budget_bytes is None else int(budget_bytes)
        floats, ints, load_t, load_v, host_t, host_v, op_start = K.run_kernel(
            self._durations, self.trace.nbytes, self._birth_ptr, self._birth_ids, self._death_ptr,
            self._death_ids, *arrays, budget, timeline)
        return self._result(plan, arrays, floats, ints, (load_t, load_v, host_t, host_v, op_start), timeline)

    # --- per-plan preparation ----------------------------------------------------------------

    def _plan_arrays(self, decisions) -> tuple:
        trace, cost, n = self.trace, self.cost, len(self.trace.ops)
        count = len(decisions)
        kind = np.zeros(count, dtype=np.int64)
        sid = np.zeros(count, dtype=np.int64)
        sync = np.zeros(count, dtype=np.bool_)
        wrap = np.zeros(count, dtype=np.int64)
        link_bytes = np.zeros(count, dtype=np.int64)
        d2h = np.zeros(count)
        h2d = np.zeros(count)
        comp = np.zeros(count)
        chain = np.zeros(count)
        temp = np.zeros(count, dtype=np.int64)
        absent = np.zeros(len(trace.storages), dtype=np.bool_)
        issue, need, out = [], [], []
        away = _recompute_gaps(decisions)
        for k, d in enumerate(decisions):
            sid[k] = d.storage
            out.append((d.out_after, 0, k))
            if d.action == "recompute":
                kind[k] = K.RECOMPUTE
                chain[k], temp[k] = self._chain(d.storage, d.back_before, away)
                need.append((d.back_before, _producer_rank(trace, d.storage), k))
                continue
            nbytes = int(trace.nbytes[d.storage])
            link_bytes[k] = int(round(nbytes * d.compress_ratio)) if d.compress_ratio else nbytes
            d2h[k], h2d[k] = cost.d2h_s(link_bytes[k]), cost.h2d_s(link_bytes[k])
            comp[k] = cost.memory_pass_s(nbytes) if d.compress_ratio else 0.0
            sync[k] = d.sync
            trigger = d.prefetch_at
            if d.wraps:
                wrap[k] = K.TAIL_WRAP if trigger > d.out_after else K.HEAD_WRAP
                absent[d.storage] |= wrap[k] == K.HEAD_WRAP
            issue.append((trigger, 0, k))
            if wrap[k] != K.TAIL_WRAP:
                need.append((d.back_before, -1, k))
        return (kind, sid, sync, wrap, link_bytes, d2h, h2d, comp, chain, temp,
                *_event_csr(issue, n), *_event_csr(need, n), *_event_csr(out, n), absent)

    def _chain(self, sid: int, before: int, away: dict, depth: int = 0) -> tuple[float, int]:
        """Time of the producer chain rebuilding `sid` before op `before`, and temporary bytes
        of recomputed-away inputs rebuilt for it (recursively)."""
        key = (sid, before)
        if key not in self._chains:
            ops, inputs = self.trace.lineage(sid, before)
            self._chains[key] = (float(self._durations[list(ops)].sum()) if ops else 0.0, inputs)
        seconds, inputs = self._chains[key]
        temp = 0
        if depth < MAX_CHAIN_DEPTH:
            for r in inputs:
                if any(lo < before < hi for lo, hi in away.get(r, ())):
                    sub_s, sub_temp = self._chain(r, before, away, depth + 1)
                    seconds += sub_s
                    temp += int(self.trace.nbytes[r]) + sub_temp
        return seconds, temp

    # --- results ---------------------------------------------------------------------------------

    def _result(self, plan, arrays, floats, ints, recorded, timeline: bool) -> SimResult:
        feasible = bool(ints[K.I_FEASIBLE])
        stalls = floats[K.R_MEM_STALL] + floats[K.R_PREFETCH_STALL] + floats[K.R_SYNC_STALL]
        breakdown = {
            "compute_s": float(floats[K.R_COMPUTE]),
            "memory_stall_s": float(floats[K.R_MEM_STALL]),
            "prefetch_stall_s": float(floats[K.R_PREFETCH_STALL]),
            "recompute_s": float(floats[K.R_RECOMPUTE]),
            "sync_stall_s": float(floats[K.R_SYNC_STALL]),
            "overlap_s": float(max(0.0, floats[K.R_COPY_BUSY] - stalls)),
        }
        extra = {}
        if timeline and feasible:
            load_t, load_v, host_t, host_v, op_start = recorded
            n_load = int(ints[K.I_N_LOAD_EVENTS])
            extra = dict(timeline_t=load_t[:n_load].copy(), timeline_load=load_v[:n_load].copy(),
                         op_start_s=op_start.copy(), lanes=self._lanes(arrays, op_start))
        return SimResult(
            feasible=feasible,
            time_s=float(floats[K.R_TIME]) if feasible else float("inf"),
            baseline_time_s=self.baseline_time_s,
            peak_load_bytes=int(ints[K.I_PEAK]),
            breakdown=breakdown,
            host_peak_bytes=_host_peak(arrays, recorded, ints) if feasible else 0,
            link_bytes=int(ints[K.I_LINK]),
            infeasible_op=None if feasible else int(ints[K.I_BAD_OP]),
            shortfall_bytes=0 if feasible else int(ints[K.I_SHORTFALL]),
            **extra)

    def _lanes(self, arrays, op_start) -> dict:
        """Busy intervals of the compute stream (copy lanes are drawn from host events)."""
        ends = op_start + self._durations
        return {"compute": [(float(s), float(e)) for s, e in zip(op_start, ends) if e > s]}


def _host_peak(arrays, recorded, ints) -> int:
    """Largest pinned host memory held at once (needs the recorded host events)."""
    wrap, link_bytes = arrays[3], arrays[4]
    host_t, host_v = recorded[2], recorded[3]
    n_host = int(ints[K.I_N_HOST_EVENTS])
    start = int(link_bytes[wrap == K.HEAD_WRAP].sum())
    if n_host == 0:
        return start if link_bytes.size else 0
    order = np.argsort(host_t[:n_host], kind="stable")
    return int(max(start, start + np.cumsum(host_v[:n_host][order]).max()))


def _recompute_gaps(decisions) -> dict[int, list[tuple[int, int]]]:
    """Per storage, the (out_after, back_before) gaps during which it is recomputed away."""
    away: dict[int, list[tuple[int, int]]] = {}
    for d in decisions:
        if d.action == "recompute":
            away.setdefault(d.storage, []).append((d.out_after, d.back_before))
    return away


def _producer_rank(trace: Trace, sid: int) -> int:
    """Recomputes at one op run in producer order, so a chain finds its inputs rebuilt."""
    producer = trace.producer(sid)
    return -1 if producer is None else producer


def _csr(keys: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Group `values` by integer `keys` in [0, n) as (ptr, ids)."""
    order = np.argsort(keys, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.add.at(ptr, keys + 1, 1)
    return np.cumsum(ptr), np.ascontiguousarray(values[order], dtype=np.int64)


def _event_csr(events: list[tuple[int, int, int]], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(op, rank, decision) triples as a CSR over ops, ordered by rank then decision."""
    if not events:
        return np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    arr = np.array(sorted(events), dtype=np.int64)
    return _csr(arr[:, 0], arr[:, 2], n)
