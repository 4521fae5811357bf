"""Find the repeating training iteration in a stream of malloc/free records (paper 000, §V).

SmartPool/AutoSwap record every Malloc and Free (and, for AutoSwap, every read/write) from
the start of training and, "once two consecutive subsequences are detected to be repeating",
take one of them as the iteration to optimise. Block addresses change from iteration to
iteration, so, as in the authors' implementation, a record is compared by a signature that
does not name the block: a malloc by its size, a free (or an access) by the block's size and
its age in records since that block's malloc.

Detection. Let t be the signature sequence and p a candidate period. The stream is
p-periodic from index L(p) on when t[i] == t[i+p] for every i >= L(p); the longest such
suffix is p plus the longest common suffix of t and t shifted by p, which the Z-function
of the reversed sequence gives for every p at once (O(n) in all). A period counts when its
periodic suffix holds at least `min_repeats` full periods ("two consecutive subsequences").
The iteration is the period whose steady state starts earliest (smallest L), ties going to
the smallest period: a multiple of the true period never starts earlier, and a repetition
inside one iteration (identical layers) cannot make the rest of the stream periodic.

Cut. Any p consecutive records of the steady state are one iteration up to rotation; the
cut starts where the live bytes are lowest (between iterations only what persists across
them is allocated), the earliest such point. Every block instance of the whole stream that
is alive inside the window becomes one storage, clipped to it: blocks allocated before the
window and still alive start at op 0 (a block that lives across the iteration boundary is
the previous iteration's instance at the head and this iteration's at the tail), blocks
alive at the end of the window end at op p, and blocks alive through the whole window are
persistent. So the cut's load curve is the steady-state load.

Ops: one op per record, in record order, as the paper counts "operation indices" (each
malloc/free/read/write is one); a malloc writes its storage, a read/write reads/writes it,
a free touches nothing (its storage is gone during the free op: lifetimes are half-open).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import MemplanError
from ..model import Op, Storage, Trace

RECORD_KINDS = ("malloc", "free", "read", "write")
DEFAULT_MIN_PERIOD = 2  # a 1-record "iteration" is never a training step
DEFAULT_MIN_REPEATS = 2  # "two consecutive subsequences are detected to be repeating"


@dataclass(frozen=True, kw_only=True)
class Record:
    """One allocator or access event of the stream."""

    kind: str  # one of RECORD_KINDS
    block: object  # block id or address (hashable); addresses may be reused after a free
    size: int | None = None  # bytes; needed for a malloc, taken from the malloc otherwise

    def __post_init__(self):
        if self.kind not in RECORD_KINDS:
            raise MemplanError(f"record kind {self.kind!r} is not one of {RECORD_KINDS}")
        if self.kind == "malloc" and (not isinstance(self.size, int) or self.size < 0):
            raise MemplanError(f"malloc of block {self.block!r} needs an integer size >= 0")


@dataclass(frozen=True, kw_only=True)
class IterationCut:
    """The detected iteration."""

    period: int  # records per iteration
    steady_from: int  # first record of the periodic steady state (records before it are warm-up)
    start: int  # first record of the cut window [start, start + period)
    repeats: float  # how many periods the steady state spans
    trace: Trace  # the cut iteration


def as_records(items: Iterable) -> list[Record]:
    """Normalise records given as Record, (kind, block, size) tuples or dicts.

    Args:
        items: the stream; a tuple may omit the size of a free; a dict has keys
            kind, block (or id/addr/address) and size.
    Returns:
        The records as Record objects.
    """
    out = []
    for i, item in enumerate(items):
        if isinstance(item, Record):
            out.append(item)
        elif isinstance(item, Mapping):
            block = next((item[k] for k in ("block", "id", "addr", "address") if k in item), None)
            out.append(Record(kind=item.get("kind"), block=block, size=item.get("size")))
        elif isinstance(item, Sequence) and len(item) in (2, 3):
            out.append(Record(kind=item[0], block=item[1], size=item[2] if len(item) == 3 else None))
        else:
            raise MemplanError(f"record {i}: expected (kind, block, size), a dict or a Record, got {item!r}")
    return out


@dataclass(frozen=True, kw_only=True)
class _Instances:
    """Block instances (one malloc..free pair each) of a stream, and who each record touches."""

    starts: np.ndarray  # record index of each instance's malloc
    ends: np.ndarray  # record index of its free (len(records) if never freed)
    sizes: np.ndarray  # bytes
    blocks: tuple  # the block id of each instance
    of_record: np.ndarray  # per record, the instance it touches (-1: an unknown block)


def _instances(records: Sequence[Record]) -> _Instances:
    n = len(records)
    live: dict = {}
    starts, sizes, blocks, ends = [], [], [], []
    of_record = np.full(n, -1, dtype=np.int64)
    for i, r in enumerate(records):
        if r.kind == "malloc":
            if r.block in live:  # a second malloc of a live address: the first one ended unseen
                ends[live[r.block]] = i
            live[r.block] = len(starts)
            starts.append(i), sizes.append(r.size), blocks.append(r.block), ends.append(n)
            of_record[i] = live[r.block]
        elif r.block in live:
            of_record[i] = live[r.block]
            if r.kind == "free":
                ends[live.pop(r.block)] = i
    return _Instances(starts=np.array(starts, dtype=np.int64), ends=np.array(ends, dtype=np.int64),
                      sizes=np.array(sizes, dtype=np.int64), blocks=tuple(blocks), of_record=of_record)


def signatures(records: Sequence[Record]) -> np.ndarray:
    """Address-free signature ids of the records: equal ids mean "the same event next iteration".

    A malloc is (malloc, size); any other record is (kind, block size, records since the
    block's malloc), or (kind, None, None) for a block allocated before the stream began.

    Returns:
        int64 array, one small integer per record.
    """
    inst = _instances(records)
    codes: dict = {}
    out = np.empty(len(records), dtype=np.int64)
    for i, r in enumerate(records):
        k = inst.of_record[i]
        if r.kind == "malloc":
            key = ("malloc", r.size)
        elif k < 0:
            key = (r.kind, None, None)
        else:
            key = (r.kind, int(inst.sizes[k]), i - int(inst.starts[k]))
        out[i] = codes.setdefault(key, len(codes))
    return out


def _z_function(s: np.ndarray) -> np.ndarray:
    """z[i] = length of the longest common prefix of s and s[i:] (z[0] = len(s))."""
    n = len(s)
    z = np.zeros(n, dtype=np.int64)
    if n == 0:
        return z
    z[0] = n
    values = s.tolist()  # list indexing is several times faster than numpy scalars here
    left = right = 0
    for i in range(1, n):
        k = min(right - i, int(z[i - left])) if i < right else 0
        while i + k < n and values[k] == values[i + k]:
            k += 1
        z[i] = k
        if i + k > right:
            left, right = i, i + k
    return z


def detect_period(sig: np.ndarray, *, min_period: int = DEFAULT_MIN_PERIOD,
                  min_repeats: int = DEFAULT_MIN_REPEATS) -> tuple[int, int]:
    """The iteration period of a signature sequence and where its steady state begins.

    Args:
        sig: per record signature ids (see `signatures`).
        min_period: shortest period considered.
        min_repeats: full periods the periodic suffix must hold.
    Returns:
        (period, steady_from).
    Raises:
        MemplanError: when no period repeats `min_repeats` times.
    """
    if min_period < 1 or min_repeats < 1:
        raise MemplanError("min_period and min_repeats must be at least 1")
    n = len(sig)
    z = _z_function(np.asarray(sig)[::-1])
    periods = np.arange(n)
    # Periodic suffix length for period p: p plus the common suffix of sig and sig shifted by p.
    suffix = periods + z
    ok = (periods >= min_period) & (suffix >= min_repeats * periods)
    if n == 0 or not ok.any():
        raise MemplanError(f"no repeating iteration found in {n} records "
                           f"(need {min_repeats} consecutive repeats of at least {min_period} records)")
    steady = np.where(ok, n - suffix, n)
    best = int(np.flatnonzero(steady == steady.min())[0])  # earliest steady state, then shortest period
    return best, int(steady[best])


def cut_iteration(records: Iterable, *, min_period: int = DEFAULT_MIN_PERIOD,
                  min_repeats: int = DEFAULT_MIN_REPEATS, meta: dict | None = None) -> IterationCut:
    """Detect the repeating iteration of a multi-iteration record stream and cut one out.

    Args:
        records: the stream (see `as_records` for accepted forms), in program order.
        min_period: shortest period considered.
        min_repeats: consecutive repeats required (2, as in the paper).
        meta: extra metadata for the trace.
    Returns:
        The IterationCut with its Trace.
    Raises:
        MemplanError: no repeating iteration.
    """
    recs = as_records(records)
    inst = _instances(recs)
    period, steady_from = detect_period(signatures(recs), min_period=min_period, min_repeats=min_repeats)
    start = _cut_start(inst, len(recs), period, steady_from)
    trace = _window_trace(recs, inst, start, period, meta or {})
    return IterationCut(period=period, steady_from=steady_from, start=start,
                        repeats=(len(recs) - steady_from) / period, trace=trace)


def _live_before(inst: _Instances, n: int) -> np.ndarray:
    """Bytes allocated just before each record index 0..n."""
    delta = np.zeros(n + 2, dtype=np.int64)
    np.add.at(delta, inst.starts + 1, inst.sizes)
    np.add.at(delta, inst.ends + 1, -inst.sizes)
    return np.cumsum(delta)[: n + 1]


def _cut_start(inst: _Instances, n: int, period: int, steady_from: int) -> int:
    live = _live_before(inst, n)
    window = live[steady_from: steady_from + period]
    return steady_from + int(np.argmin(window))


def _window_trace(recs: Sequence[Record], inst: _Instances, start: int, period: int, meta: dict) -> Trace:
    end = start + period
    inside = np.flatnonzero((inst.starts < end) & (inst.ends > start))
    sid_of = {int(k): sid for sid, k in enumerate(inside)}
    storages = []
    for sid, k in enumerate(inside):
        lo, hi = max(int(inst.starts[k]), start) - start, min(int(inst.ends[k]), end) - start
        # Alive from before the window through its end: held across the iteration boundary.
        persistent = bool(inst.starts[k] < start and inst.ends[k] >= end)
        storages.append(Storage(id=sid, nbytes=int(inst.sizes[k]), kind="temp", alloc_op=lo, free_op=hi,
                                persistent=persistent, name=str(inst.blocks[k])))
    ops = []
    for i in range(start, end):
        sid = sid_of.get(int(inst.of_record[i]))
        touched = () if sid is None else (sid,)
        kind = recs[i].kind
        ops.append(Op(index=i - start, name=kind, phase="forward",
                      reads=touched if kind == "read" else (),
                      writes=touched if kind in ("malloc", "write") else ()))
    info = {"source": "iteration", "period": period, "start_record": start, **meta}
    return Trace(storages=tuple(storages), ops=tuple(ops), meta=info)
