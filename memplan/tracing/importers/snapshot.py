"""Import a PyTorch CUDA memory snapshot (`torch.cuda.memory._snapshot()` / `_dump_snapshot()`).

The snapshot is a dict: `segments` (the allocator's state when it was taken) and
`device_traces` (per device, the allocator events recorded since
`torch.cuda.memory._record_memory_history()`: `action`, `addr`, `size`, `stream`, `frames`).
A storage is one alloc..free pair of an address (addresses are reused). Every alloc and every
free that ends a storage is one op. Frees of addresses allocated before the recorded window
are skipped; allocations alive at the end stay alive; segment_alloc/segment_free/segment_map/
segment_unmap/oom/snapshot events are ignored. Blocks still allocated in `segments` that the
window never allocated (parameters, optimizer state allocated earlier) are added as
persistent storages alive throughout (`preexisting=True`).

The pickle written by `_dump_snapshot` is read with an Unpickler that refuses every class,
so only dicts, lists, tuples, strings, numbers, bools and None can be rebuilt: a file that
tries to import anything (e.g. `os.system`) is rejected before it can run.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import MemplanError, TraceFormatError
from ..iteration import Record
from ...model.blocks import allocated_size
from ...model import Op, Storage, Trace

log = logging.getLogger(__name__)

FREE_ON = ("completed", "requested")  # which event ends a lifetime
LIVE_BLOCK_STATES = ("active_allocated", "active_awaiting_free")
PICKLE_PROTOCOL_BYTE = 0x80  # first byte of a pickle of protocol 2 or later


class _NoClassUnpickler(pickle.Unpickler):
    """An Unpickler that rebuilds plain containers and scalars only."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: snapshots hold plain data only")


def safe_unpickle(data: bytes, source: str = "<pickle>"):
    """Unpickle `data` without importing or calling anything.

    Raises:
        TraceFormatError: the data is not a pickle or names a class or function.
    """
    try:
        return _NoClassUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise TraceFormatError(f"{source}: unsafe or invalid pickle: {exc}") from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, OverflowError) as exc:
        raise TraceFormatError(f"{source}: not a valid pickle ({type(exc).__name__}: {exc})") from None


def read_snapshot_data(path: str | os.PathLike) -> dict:
    """The snapshot dict of a `_dump_snapshot` pickle or a JSON file holding the same dict.

    Raises:
        TraceFormatError: unreadable, unsafe, or not a snapshot dict.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read: {exc}") from None
    if data[:1] == bytes([PICKLE_PROTOCOL_BYTE]):
        snap = safe_unpickle(data, str(path))
    else:
        try:
            snap = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TraceFormatError(f"{path}: neither a snapshot pickle nor JSON ({exc})") from None
    _check_snapshot(snap, str(path))
    return snap


def read_snapshot(path: str | os.PathLike, *, device: int | None = None, free_on: str = "completed",
                  preexisting: bool = True) -> Trace:
    """Read a snapshot file (pickle or JSON) as a Trace; see `snapshot_to_trace`."""
    return snapshot_to_trace(read_snapshot_data(path), device=device, free_on=free_on,
                             preexisting=preexisting, source=str(path))


def _check_snapshot(snap, source: str) -> None:
    if not isinstance(snap, dict) or not isinstance(snap.get("device_traces"), list):
        raise TraceFormatError(f"{source}: not a memory snapshot: expected a dict with a 'device_traces' list "
                               "(record it with torch.cuda.memory._record_memory_history())")


@dataclass
class _Builder:
    """Storages and ops accumulated while replaying one device's events."""

    free_on: str
    storages: list = field(default_factory=list)  # [alloc_op, free_op|None, size, addr, frames]
    ops: list = field(default_factory=list)  # (name, phase, sid)
    live: dict = field(default_factory=dict)  # addr -> storage index
    phase: str = "forward"
    skipped_frees: int = 0

    def event(self, e: dict, where: str) -> None:
        action = e.get("action")
        if action == "alloc":
            self._alloc(e, where)
        elif action in ("free_requested", "free_completed"):
            if action == f"free_{self.free_on}":
                self._free(e, where)

    def _alloc(self, e: dict, where: str) -> None:
        addr, size = _field(e, "addr", where), _field(e, "size", where)
        if addr in self.live:  # an alloc over a live address: its free was not recorded
            self._close(addr)
        self.phase = _phase_of(e.get("frames"), self.phase)
        self.live[addr] = len(self.storages)
        self.storages.append([len(self.ops), None, size, addr])
        self.ops.append(("alloc", self.phase, self.live[addr]))

    def _free(self, e: dict, where: str) -> None:
        addr = _field(e, "addr", where)
        if addr not in self.live:
            self.skipped_frees += 1  # allocated before the recorded window began
            return
        self.phase = _phase_of(e.get("frames"), self.phase)
        self._close(addr)
        self.ops.append(("free", self.phase, None))

    def _close(self, addr: int) -> None:
        self.storages[self.live.pop(addr)][1] = len(self.ops)


def _field(e: dict, name: str, where: str) -> int:
    value = e.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TraceFormatError(f"{where}: field {name!r}: expected a non-negative integer, got {value!r}")
    return value


def _phase_of(frames, current: str) -> str:
    """The phase a Python stack shows (autograd backward, torch.optim), else the current one."""
    if not isinstance(frames, list):
        return current
    for f in frames:
        if not isinstance(f, dict):
            continue
        filename, name = str(f.get("filename", "")), str(f.get("name", ""))
        if "torch/optim/" in filename.replace("\\", "/"):
            return "optimizer"
        if "backward" in name:
            return "backward"
    if current == "optimizer" and frames:
        return "forward"  # a known stack outside the optimizer: the next iteration began
    return current


def snapshot_to_trace(snap: dict, *, device: int | None = None, free_on: str = "completed",
                      preexisting: bool = True, source: str = "<snapshot>") -> Trace:
    """Turn a memory snapshot dict into a Trace.

    Args:
        snap: the dict `torch.cuda.memory._snapshot()` returns.
        device: which device's trace (default: the one with the most allocations).
        free_on: "completed" (memory reusable again, as the allocator sees it) or
            "requested" (the tensor was freed) ends a lifetime.
        preexisting: add blocks still allocated in `segments` that the window never
            allocated, as persistent storages.
        source: names the input in errors.
    Returns:
        The Trace: one op per alloc and per lifetime-ending free.
    Raises:
        TraceFormatError: not a snapshot, no events, or a malformed event.
    """
    if free_on not in FREE_ON:
        raise MemplanError(f"free_on must be one of {FREE_ON}, got {free_on!r}")
    _check_snapshot(snap, source)
    device = _pick_device(snap["device_traces"], device, source)
    b = _Builder(free_on=free_on)
    for i, e in enumerate(snap["device_traces"][device]):
        if not isinstance(e, dict):
            raise TraceFormatError(f"{source}: device {device} event {i}: expected a dict")
        b.event(e, f"{source}: device {device} event {i}")
    if not b.ops:
        raise TraceFormatError(f"{source}: device {device} has no alloc/free events "
                               "(was torch.cuda.memory._record_memory_history() enabled?)")
    if b.skipped_frees:
        log.info("%s: skipped %d frees of blocks allocated before the recorded window", source, b.skipped_frees)
    return _trace_of(b, snap, device, preexisting, source)


def snapshot_records(snap: dict, *, device: int | None = None, free_on: str = "completed") -> list[Record]:
    """The alloc/free events of one device as records for `memplan.tracing.iteration.cut_iteration`.

    A snapshot recorded over several training steps holds several iterations; cutting one
    out gives a steady-state iteration instead of the whole window.

    Returns:
        One malloc record per alloc and one free record per `free_<free_on>` event.
    """
    if free_on not in FREE_ON:
        raise MemplanError(f"free_on must be one of {FREE_ON}, got {free_on!r}")
    _check_snapshot(snap, "<snapshot>")
    device = _pick_device(snap["device_traces"], device, "<snapshot>")
    kinds = {"alloc": "malloc", f"free_{free_on}": "free"}
    return [Record(kind=kinds[e["action"]], block=e.get("addr"), size=e.get("size"))
            for e in snap["device_traces"][device] if isinstance(e, dict) and e.get("action") in kinds]


def _pick_device(traces: list, device: int | None, source: str) -> int:
    if device is not None:
        if not 0 <= device < len(traces) or not isinstance(traces[device], list):
            raise TraceFormatError(f"{source}: no trace for device {device} ({len(traces)} devices)")
        return device
    counts = [sum(isinstance(e, dict) and e.get("action") == "alloc" for e in t) if isinstance(t, list) else -1
              for t in traces]
    if not counts or max(counts) < 0:
        raise TraceFormatError(f"{source}: 'device_traces' holds no list of events")
    return counts.index(max(counts))


def _list(value) -> list:
    """`value` if it is a list (of segments, blocks), else nothing to read."""
    return value if isinstance(value, list) else []


def _trace_of(b: _Builder, snap: dict, device: int, preexisting: bool, source: str) -> Trace:
    n = len(b.ops)
    # events give requested sizes; the allocator counts (and `memory_allocated` sums) blocks
    storages = [Storage(id=sid, nbytes=allocated_size(size), kind="temp", alloc_op=lo,
                        free_op=n if hi is None else hi, name=hex(addr))
                for sid, (lo, hi, size, addr) in enumerate(b.storages)]
    if preexisting:
        for addr, size in _preexisting_blocks(snap, device, set(b.live)):
            storages.append(Storage(id=len(storages), nbytes=size, kind="temp", alloc_op=0, free_op=n,
                                    persistent=True, name=hex(addr)))
    ops = tuple(Op(index=i, name=name, phase=phase, writes=() if sid is None else (sid,))
                for i, (name, phase, sid) in enumerate(b.ops))
    meta = {"source": "snapshot", "file": source, "device": device, "free_on": b.free_on,
            "skipped_frees": b.skipped_frees}
    return Trace(storages=tuple(storages), ops=ops, meta=meta)


def _preexisting_blocks(snap: dict, device: int, live_at_end: set) -> list[tuple[int, int]]:
    """(address, size) of blocks allocated in the snapshot's segments but not by the window."""
    out = []
    for seg in _list(snap.get("segments")):
        if not isinstance(seg, dict) or seg.get("device", device) != device:
            continue
        addr = seg.get("address")
        for blk in _list(seg.get("blocks")):
            size = blk.get("size") if isinstance(blk, dict) else None
            blk_addr = blk.get("address", addr) if isinstance(blk, dict) else None
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (size, addr, blk_addr)):
                break  # without sizes and addresses the addresses of later blocks are unknown
            if blk.get("state") in LIVE_BLOCK_STATES and blk_addr not in live_at_end:
                out.append((blk_addr, size))
            addr = blk_addr + size
    return out
