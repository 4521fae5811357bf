"""Swap decisions run at the storage level: translation to hook points.

Parameters, buffers, gradients and optimizer state cannot be swapped through saved-tensor
hooks (the module, `.grad` or `optimizer.state` keeps its reference), and their gaps may
wrap around the iteration boundary or be the second gap of a storage; an activation's
later gaps (between two backward consumers, or in forward after autograd saved it) are
not seen by those hooks either. These decisions run at the storage level instead (see
storage_swap.py): the storage is emptied after its last access and refilled before its
next one, at hook points (events.py) chosen for each gap. The live storage is found
through its owner, or for an activation through the tensor autograd saved (so only after
its first pack in the step). This module decides which decisions can run that way and
where; the others are listed in `skipped` with the reason and kept resident.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model import Decision, Trace
from .events import HookPoint, hook_points, select_points
from .slab import align_up

STORAGE_KINDS = frozenset({"param", "optimizer_state", "grad"})  # kinds with an owner holding them
OWNER_KINDS = ("param", "buffer", "grad", "state", "activation")  # activation: found through its pack


@dataclass(frozen=True, kw_only=True)
class Owner:
    """Who holds a storage at run time (from the trace's `meta["owners"]`)."""

    kind: str  # one of OWNER_KINDS
    name: str = ""  # parameter or buffer name (param, buffer, grad)
    storage: int = -1  # trace storage id (activation: the one whose pack is watched)
    group: int = -1  # optimizer param group (state)
    index: int = -1  # parameter's index in that group (state)
    key: str = ""  # state entry, e.g. "exp_avg" (state)

    @staticmethod
    def from_record(record: dict) -> "Owner":
        """The owner described by one `meta["owners"]` record."""
        return Owner(kind=record["owner"], name=record.get("name", ""), group=int(record.get("group", -1)),
                     index=int(record.get("index", -1)), key=record.get("key", ""))


@dataclass(frozen=True, kw_only=True)
class StorageSwapSpec:
    """One gap of one storage, executed at three hook points."""

    storage: int  # trace storage id
    nbytes: int  # its size
    owner: Owner  # where the live tensor is found
    sync: bool  # the compute stream waits for the swap-out
    out_at: tuple  # hook point key of the swap-out
    fetch_at: tuple  # hook point key where the prefetch is issued
    wait_at: tuple  # hook point key where the compute stream waits for it
    wraps: bool  # the gap crosses the iteration boundary


@dataclass(frozen=True, kw_only=True)
class StorageSchedule:
    """Every storage-level swap of a plan."""

    swaps: tuple[StorageSwapSpec, ...]  # in order of storage, then gap
    points: tuple[HookPoint, ...]  # the trace's hook points
    slab_bytes: int  # host bytes: one fixed region per swapped storage
    state: tuple[Owner, ...] = ()  # every optimizer state tensor of the trace (its steady state)

    @property
    def keys(self) -> frozenset:
        """Every hook point key an action is attached to."""
        return frozenset(k for s in self.swaps for k in (s.out_at, s.fetch_at, s.wait_at))

    @property
    def watched(self) -> frozenset:
        """Activations found through their pack: the executor must see the packs."""
        return frozenset(s.storage for s in self.swaps if s.owner.kind == "activation")


def is_storage_level(trace: Trace, sid: int) -> bool:
    """True for storages an owner keeps referencing (parameters, state, gradients, persistent)."""
    s = trace.storages[sid]
    return s.persistent or s.kind in STORAGE_KINDS


def build_storage_schedule(trace: Trace, decisions, skipped: list, regions=(),
                           first_pack: dict | None = None) -> StorageSchedule:
    """The executable storage-level swaps among `decisions`; the rest go to `skipped`.

    Args:
        trace: the trace (with meta "hook_events" and "owners").
        decisions: swap decisions to run at the storage level.
        skipped: receives (decision, reason) for each decision kept resident instead.
        regions: module paths of the checkpoint regions the recompute executor runs.
        first_pack: storage id -> ops recorded before its first pack that the executor
            sees (packs inside checkpoint regions are not seen); activations need one.
    """
    points = hook_points(trace)
    owners = {int(r["sid"]): Owner.from_record(r) for r in trace.meta.get("owners", ())}
    packed = first_pack or {}
    specs: list[StorageSwapSpec] = []
    taken: dict[int, list[Decision]] = {}
    for d in sorted(decisions, key=lambda d: (d.storage, d.out_after)):
        owner = owners.get(d.storage)
        if owner is None and d.storage in packed:
            owner = Owner(kind="activation", storage=d.storage)
        reason, keys = _problem(trace, d, points, owner, taken.get(d.storage, ()), regions, packed.get(d.storage))
        if reason:
            skipped.append((d, reason))
            continue
        taken.setdefault(d.storage, []).append(d)
        specs.append(StorageSwapSpec(storage=d.storage, nbytes=trace.storages[d.storage].nbytes,
                                     owner=owner, sync=d.sync, out_at=keys[0], fetch_at=keys[1],
                                     wait_at=keys[2], wraps=d.wraps))
    slab = sum(align_up(trace.storages[sid].nbytes) for sid in taken)
    state = tuple(o for o in owners.values() if o.kind == "state")
    return StorageSchedule(swaps=tuple(specs), points=points, slab_bytes=slab, state=state)


def _problem(trace: Trace, d: Decision, points, owner: Owner | None, taken, regions,
             pack_pos: int | None) -> tuple[str, tuple]:
    """(why decision `d` cannot run at the storage level, ()) or ("", its three point keys)."""
    if not points:
        return "the trace has no hook-point record (re-trace it with this version of memplan)", ()
    if owner is None:
        return ("no run-time reference to it: not a parameter, buffer, gradient or optimizer state, and not "
                "saved for backward (or saved inside a recompute region)"), ()
    if trace.storages[d.storage].nbytes == 0:
        return "empty storage", ()
    if _accessed_inside(trace, d):
        return "the storage is accessed inside the gap (the plan does not fit this trace)", ()
    if any(_overlap(trace.num_steps, d, other) for other in taken):
        return "overlaps another gap of the same storage", ()
    region = _recomputed_in(trace, d, regions)
    if region is not None:
        return f"read again by the recomputation of checkpoint region {region!r} during its gap", ()
    out_ok = _reachable(owner, pack_pos)
    keys = select_points(points, trace.num_steps, d.out_after, d.back_before, d.prefetch_at, out_ok)
    if keys is not None:
        return "", keys
    if out_ok is not None and select_points(points, trace.num_steps, d.out_after, d.back_before, d.prefetch_at):
        return UNREACHABLE[owner.kind], ()
    return "no hook point between its last access and its next one to leave and come back at", ()


UNREACHABLE = {"grad": "its gradient is in .grad only once accumulated, and no hook point follows that inside the gap",
               "activation": "autograd saves it only after this gap: there is no reference to it yet"}


def _reachable(owner: Owner, pack_pos: int | None):
    """Which swap-out points find the live storage (None: all of them)."""
    if owner.kind == "grad":  # `.grad` holds it only once accumulation is done
        return lambda p: p.key[0] == "acc" and p.key[1] == owner.name
    if owner.kind == "activation":  # after its first pack, strictly (a point at the same count may precede it)
        return lambda p: p.pos > pack_pos
    return None


def _gap_ops(n: int, d: Decision) -> range | list:
    """Op indices strictly inside the gap of `d` (wrapping around)."""
    if not d.wraps:
        return range(d.out_after + 1, d.back_before)
    return list(range(d.out_after + 1, n)) + list(range(0, d.back_before))


def _accessed_inside(trace: Trace, d: Decision) -> bool:
    acc = trace.accesses[d.storage]
    if not d.wraps:
        return any(d.out_after < a < d.back_before for a in acc)
    return any(a > d.out_after or a < d.back_before for a in acc)


def _overlap(n: int, a: Decision, b: Decision) -> bool:
    """True when two gaps of one storage share an op (on the unrolled two-iteration axis)."""
    def spans(d: Decision) -> list[tuple[int, int]]:
        end = d.back_before + n if d.wraps else d.back_before
        return [(d.out_after + shift, end + shift) for shift in (-n, 0, n)]

    return any(s1 < e2 and s2 < e1 for s1, e1 in spans(a) for s2, e2 in spans(b))


def _recomputed_in(trace: Trace, d: Decision, regions) -> str | None:
    """A checkpoint region that reads the storage in forward and re-runs inside its gap."""
    if not regions:
        return None
    readers = {trace.ops[a].module for a in trace.accesses[d.storage] if trace.ops[a].phase == "forward"}
    hit = [r for r in regions if any(m == r or m.startswith(r + ".") for m in readers)]
    if hit and any(trace.ops[i].phase == "backward" for i in _gap_ops(trace.num_steps, d)):
        return hit[0]
    return None
