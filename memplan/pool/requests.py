"""The runtime pool of a plan: the allocation requests a planned step makes, in order, each at its
offset in the plan's layout, ready for the replay allocator (replay_allocator.py).

Only residencies whose allocation a step requests are planned: persistent storages
(parameters, optimizer state) and the step's inputs exist before the step starts, so they
stay with the heap (a persistent storage's swap-in is planned when it is released again
within the step), and so do storages under MIN_SLOT_BYTES (scalars, small statistics: a
few bytes in all, of sizes so common that a request the trace does not know would take
their slots). The plan's layout is then mapped monotonically onto aligned addresses
(`aligned_offsets`): every block starts on an ALIGNMENT boundary as PyTorch's caching allocator
would give it, buffers keep their order in the address space (so no two that overlap in time
can meet), and the address ranges only dropped buffers used close up.
"""

from __future__ import annotations

import numpy as np

from ..errors import MemplanError
from ..model import PoolSlot, Trace
from ..model.program import StepProgram
from ..sim.program import residencies
from .check import check_layout
from .problem import make_problem
from .replay_allocator import ReplayPlan

ALIGNMENT = 512  # bytes: the caching allocator's smallest block (kMinBlockSize), so kernels see the same alignment
MIN_SLOT_BYTES = 512  # smaller storages stay with the heap: few bytes, and sizes too common to match reliably
LIBRARY_KIND = "workspace"  # memory libraries and kernels take themselves (memplan.cost.device_memory): the heap's


def step_requests(trace: Trace, program: StepProgram, slots: tuple[PoolSlot, ...],
                  alignment: int = ALIGNMENT, min_bytes: int = MIN_SLOT_BYTES) -> ReplayPlan:
    """The requests of one planned step at their planned offsets (aligned), in request order.

    Args:
        trace: the traced iteration.
        program: the plan's step program (its residencies are the buffers).
        slots: the plan's pool slots (`Plan.pool`), one per residency (storage, start).
        alignment: every block starts at a multiple of this many bytes.
        min_bytes: storages smaller than this get no slot.
    Returns:
        A ReplayPlan ordered by start op, a prefetched or recomputed storage before the outputs
        of the op it is due at, then storage id; `storages` names each slot's storage.
    Raises:
        MemplanError: the plan has no pool layout.
    """
    if not slots:
        raise MemplanError("the plan has no pool layout: use a planner that lays one out "
                           "(smartpool, or X+smartpool such as autoswap:doa+smartpool)")
    offset_of = {(s.storage, s.start): s.offset for s in slots}
    rows = sorted((r for r in residencies(trace, program) if r[:2] in offset_of and trace.nbytes[r[0]] >= min_bytes
                   and _requested_in_step(trace, r) and trace.storages[r[0]].kind != LIBRARY_KIND),
                  key=lambda r: (r[1], r[3] != "fetched", r[0]))
    sids = np.array([r[0] for r in rows], np.int64)
    starts = np.array([r[1] for r in rows], np.int64)
    ends = np.array([r[2] for r in rows], np.int64)
    sizes = trace.nbytes[sids] if len(sids) else np.zeros(0, np.int64)
    planned = np.array([offset_of[r[:2]] for r in rows], np.int64)
    offsets, footprint = aligned_offsets(planned, sizes, alignment)
    blocks = _round_up(sizes, alignment)
    check_layout(make_problem(starts, ends, blocks, storages=sids), _in_problem_order(starts, sids, offsets), footprint)
    return ReplayPlan(pool_bytes=footprint, sizes=sizes.astype(np.int64), offsets=offsets, ops=starts, storages=sids)


def _requested_in_step(trace: Trace, row: tuple) -> bool:
    """Whether a step allocates this residency and frees it in time for the next step's slots: a
    persistent storage's only when it is fetched back and released again within the step; any
    other storage's unless it exists before the step (an input)."""
    sid, start, end = row[0], row[1], row[2]
    s = trace.storages[sid]
    if s.persistent:
        return 0 < start and end < trace.num_steps
    return not (start == s.alloc_op and trace.producer(sid) is None)


def aligned_offsets(offsets: np.ndarray, sizes: np.ndarray, alignment: int = ALIGNMENT) -> tuple[np.ndarray, int]:
    """Map a valid layout onto aligned addresses, keeping the order of its address boundaries.

    Every boundary b (a buffer's offset or end) goes to f(b), the least aligned value at or
    above f of the boundary below it and at or above f(offset) + the rounded size of every
    buffer ending at b. f never decreases, so buffers disjoint in the layout stay disjoint;
    gaps no buffer covers shrink to nothing.

    Args:
        offsets, sizes: the layout (bytes).
        alignment: the block alignment.
    Returns:
        (aligned offsets, footprint).
    """
    offsets = np.asarray(offsets, np.int64)
    sizes = np.asarray(sizes, np.int64)
    if not len(offsets):
        return offsets.copy(), 0
    ends = offsets + sizes
    bounds = np.unique(np.concatenate((offsets, ends)))
    first, last = np.searchsorted(bounds, offsets), np.searchsorted(bounds, ends)
    blocks = _round_up(sizes, alignment)
    ending: dict[int, list[int]] = {}
    for k, b in enumerate(last.tolist()):
        ending.setdefault(b, []).append(k)
    mapped = [0] * len(bounds)
    for b in range(1, len(bounds)):
        need = max([mapped[b - 1]] + [mapped[first[k]] + int(blocks[k]) for k in ending.get(b, ())])
        mapped[b] = -(-need // alignment) * alignment
    out = np.array(mapped, np.int64)
    return out[first], int(out[-1])


def _round_up(sizes: np.ndarray, alignment: int) -> np.ndarray:
    return -(-np.asarray(sizes, np.int64) // alignment) * alignment


def _in_problem_order(starts: np.ndarray, sids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """`values` reordered as make_problem orders buffers (start, then storage id)."""
    return values[np.lexsort((sids, starts))]
