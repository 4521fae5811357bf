"""The simulator's per-trace and per-plan arrays: storages grouped by op, and the host's work per op."""

from __future__ import annotations

import numpy as np

from ..cost.model import Cost
from ..model import Trace
from ..model.program import HOOKED, INTERPRETED, PLAIN
from . import _codes as K


def host_peak(wrap: np.ndarray, link_bytes: np.ndarray, recorded, ints) -> int:
    """Largest pinned host memory held at once (needs the recorded host events; `wrap` and `link_bytes`:
    the kernel's per-decision arrays)."""
    host_t, host_v = recorded[2], recorded[3]
    n_host = int(ints[K.I_N_HOST_EVENTS])
    start = int(link_bytes[wrap == K.HEAD_WRAP].sum())
    if n_host == 0:
        return start if link_bytes.size else 0
    # At equal times releases go first: a prefetch that lands frees its host copy for a
    # swap-out starting at that instant.
    order = np.lexsort((host_v[:n_host], host_t[:n_host]))
    return int(max(start, start + np.cumsum(host_v[:n_host][order]).max()))


def host_per_op(trace: Trace, cost: Cost) -> dict[str, np.ndarray]:
    """The host's work at each op at each level before a plan's own: plain eager training; the
    same at the hooked level (the hooks a plan's program needs are its own: `hooked_host`); with the
    interpreted executor's dispatch mode and its identity saved-tensor hooks at every pack and unpack
    (at the op after their point)."""
    n = trace.num_steps
    plain = np.full(n, cost.host_op_s)
    every = plain.copy()
    points = [s.packed_at for s in trace.saved] + [s.unpacked_at for s in trace.saved if s.unpacked_at is not None]
    if n and points and cost.executor_s("hook"):
        np.add.at(every, np.minimum(points, n - 1), cost.executor_s("hook"))
    # the interpreted runner counts every op in its mode, under identity saved-tensor hooks (memplan.exec.interpreted)
    return {PLAIN: plain, HOOKED: plain, INTERPRETED: every + cost.executor_s("mode_op")}


def guarded_ops(n: int, out_after: np.ndarray, back_before: np.ndarray) -> np.ndarray:
    """bool per op of `n`: some storage of the decisions (columns) is away when it runs, so the interpreted
    runner checks its arguments first (memplan.exec.interpreted, `_guard`): the ops after a decision's
    `out_after` and before its `back_before` (across the step's boundary for a gap that wraps)."""
    delta = np.zeros(n + 1, dtype=np.int64)
    wraps = back_before <= out_after
    np.add.at(delta, np.minimum(out_after + 1, n), 1)
    np.add.at(delta, np.where(wraps, n, back_before), -1)
    delta[0] += int(wraps.sum())  # a wrapping gap is away from the step's start too, until its back_before
    np.add.at(delta, back_before[wraps], -1)
    return np.cumsum(delta[:-1]) > 0


def interpreted_host(base: np.ndarray, cost: Cost, out_after: np.ndarray, back_before: np.ndarray,
                     captured: np.ndarray | None = None) -> np.ndarray:
    """The host's work at each op of an interpreted program: `base` (the mode's and its identity hooks'),
    plus `guard_op_s` at each op run while a storage is away (`guarded_ops`), plus `record_op_s` at each
    op whose call it records to replay later (`captured`: StepProgram.captured_ops, repeats counted once)."""
    guard_s, record_s = cost.executor_s("guard_op"), cost.executor_s("record_op")
    host = base
    if guard_s and len(out_after):
        host = host + guard_s * guarded_ops(len(base), out_after, back_before)
    if record_s and captured is not None and len(captured):
        host = host.copy() if host is base else host
        host[captured] += record_s  # fancy assignment: a repeated op gets it once
    return host


def hooked_host(plain: np.ndarray, cost: Cost, firings, stretches=None) -> np.ndarray:
    """The host's work at each op of a hooked program: plain training's, plus `hook_call_s` per call
    its installed hooks make there (`firings`, memplan.model.hooksites; None: none priced) and
    `stretch_s` per stretch of the optimizer's step split off there (`stretches`)."""
    call_s = cost.executor_s("hook_call")
    host = plain if not call_s or firings is None else plain + call_s * firings
    return host if stretches is None or not stretches.any() else host + cost.executor_s("stretch") * stretches


def producer_ids(trace: Trace) -> np.ndarray:
    """Per storage, the op that made it (-1: none): recomputations at one op run in this order, so a
    chain finds the inputs earlier ones rebuilt."""
    return np.array([-1 if trace.producer(s) is None else trace.producer(s) for s in range(len(trace.storages))],
                    dtype=np.int64)


def csr(keys: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Group `values` by integer `keys` in [0, n) as (ptr, ids)."""
    order = np.argsort(keys, kind="stable")
    return _pointers(keys, n), np.ascontiguousarray(values[order], dtype=np.int64)


def _pointers(keys: np.ndarray, n: int) -> np.ndarray:
    """CSR row pointers of integer `keys` in [0, n): where each key's entries start, and the end."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(np.bincount(keys, minlength=n))
    return ptr
