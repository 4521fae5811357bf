"""The trace of one training iteration: storages, ops and their lifetimes.

Every planner, the simulator, the validator and the executor read this one model.
Times are op indices; a lifetime is the half-open interval [alloc_op, free_op):
the storage is resident while ops alloc_op .. free_op-1 run. An op accesses a storage
when it reads or writes its data or makes a view of it (a view needs the buffer there:
PyTorch checks a view's extent against its storage's size).
"""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .conv import ConvParams
from .hookpoints import Call, Mark, Saved

KINDS = ("param", "grad", "optimizer_state", "input", "activation", "temp", "workspace")
PHASES = ("forward", "backward", "optimizer")
OWNER_KINDS = ("param", "buffer", "grad", "state")
# Ops of the data-parallel engines (DDP, FSDP2) and their collectives: what they write is theirs.
ENGINE_OP_PREFIXES = ("c10d.", "_c10d_functional.", "fsdp.")
SCHEMA = "memplan.trace"
SCHEMA_VERSION = 5  # 3: saved tensors and module calls; 4: marks (memplan.model.hookpoints); 5: update marks
READABLE_VERSIONS = (2, 3, 4, 5)  # version 2 files have none of them, version 3 no marks, version 4 no update marks


@dataclass(frozen=True, kw_only=True)
class Storage:
    """One buffer in device memory; views and in-place results map to it."""

    id: int  # dense index, 0..len(storages)-1
    nbytes: int  # size of the buffer in bytes
    kind: str  # one of KINDS
    alloc_op: int  # first op during which it is resident (its first write, 0 if it pre-exists)
    free_op: int  # first op during which it is gone again (last use + 1, or the framework's free)
    persistent: bool = False  # alive across the iteration boundary (params, optimizer state)
    dtype: str | None = None  # torch dtype name, e.g. "float32", where known
    shape: tuple[int, ...] | None = None  # shape of the tensor that created it, where known
    name: str | None = None  # a readable or imported id (param name, snapshot address, CSV id)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"storage {self.id}: kind {self.kind!r} is not one of {KINDS}")
        if self.nbytes < 0 or self.free_op < self.alloc_op:
            raise ValueError(f"storage {self.id}: bad size or lifetime")


@dataclass(frozen=True, kw_only=True)
class Op:
    """One operator call on the compute stream, in program order."""

    index: int  # logical time: position in the trace
    name: str  # aten op (e.g. "aten.convolution.default") or layer kind
    phase: str  # one of PHASES
    module: str = ""  # path of the owning leaf module, e.g. "layer1.0.conv1"; "" if none
    reads: tuple[int, ...] = ()  # storage ids read (a view op reads the storage it aliases)
    writes: tuple[int, ...] = ()  # storage ids written (new outputs and in-place targets)
    flops: float = 0.0  # floating point operations (torch.utils.flop_counter)
    bytes_accessed: int = 0  # bytes read plus bytes written
    duration_s: float | None = None  # measured duration; None means "use the cost model"
    conv: ConvParams | None = None  # a 2-D convolution's geometry and kernels (memplan.model.conv)

    def __post_init__(self):
        if self.phase not in PHASES:
            raise ValueError(f"op {self.index}: phase {self.phase!r} is not one of {PHASES}")


@dataclass(frozen=True, kw_only=True)
class Owner:
    """Who holds a persistent storage between steps, so the executor finds it before any op runs."""

    storage: int  # storage id
    kind: str  # one of OWNER_KINDS
    name: str = ""  # parameter or buffer name (param, buffer, grad: the parameter's name)
    group: int = -1  # optimizer param group (state)
    index: int = -1  # the parameter's index in that group (state)
    key: str = ""  # state entry, e.g. "exp_avg" (state)

    def __post_init__(self):
        if self.kind not in OWNER_KINDS:
            raise ValueError(f"owner of storage {self.storage}: kind {self.kind!r} is not one of {OWNER_KINDS}")


@dataclass(frozen=True, kw_only=True)
class Layer:
    """Ops of one leaf module in one phase: the layer view of vDNN and HOME."""

    module: str  # leaf module path
    phase: str  # "forward" or "backward"
    ops: tuple[int, ...]  # op indices, ascending
    inputs: tuple[int, ...]  # storages read but not written inside the layer (X, or dY)
    outputs: tuple[int, ...]  # storages written inside the layer (Y, or dX)


@dataclass(frozen=True, kw_only=True)
class Trace:
    """One training iteration.

    A pool-only problem (a minimalloc CSV) has storages and no ops; its time axis is
    0..num_steps-1.
    """

    storages: tuple[Storage, ...]  # indexed by Storage.id
    ops: tuple[Op, ...]  # indexed by Op.index
    meta: dict = field(default_factory=dict)  # source, model, batch, device, notes
    num_steps_hint: int = 0  # time-axis length for traces without ops
    owners: tuple[Owner, ...] = ()  # holders of persistent storages (traced models only)
    saved: tuple[Saved, ...] = ()  # tensors autograd saved, in pack order (traced models only)
    calls: tuple[Call, ...] = ()  # module calls of the forward, by first op (traced models only)
    marks: tuple[Mark, ...] = ()  # gradients accumulated, optimizer steps, in the order they fired (traced models only)

    def __post_init__(self):
        for i, s in enumerate(self.storages):
            if s.id != i:
                raise ValueError(f"storage ids must be dense: position {i} holds id {s.id}")
        for i, op in enumerate(self.ops):
            if op.index != i:
                raise ValueError(f"op indices must be dense: position {i} holds index {op.index}")
        for owner in self.owners:
            if not 0 <= owner.storage < len(self.storages):
                raise ValueError(f"owner names storage {owner.storage}, the trace has {len(self.storages)}")
        for saved in self.saved:
            known = saved.storage is None or 0 <= saved.storage < len(self.storages)
            if not known or max(saved.packed_at, saved.unpacked_at or 0) > len(self.ops):
                raise ValueError(f"a saved tensor names storage {saved.storage} or a point outside the trace")
        for call in self.calls:
            if call.end_op > len(self.ops) or call.end_saved > len(self.saved) or \
                    not all(0 <= a < len(self.storages) for a in call.args):
                raise ValueError(f"call of module {call.module!r} ends outside the trace")
        for mark in self.marks:
            if mark.point > len(self.ops):
                raise ValueError(f"mark {mark.kind!r} of {mark.key!r} fired outside the trace")

    # --- sizes and the load curve -------------------------------------------------------

    @property
    def num_steps(self) -> int:
        """Length of the time axis: number of ops, or the hint for pool-only traces."""
        return len(self.ops) or self.num_steps_hint

    @cached_property
    def nbytes(self) -> np.ndarray:
        """Storage sizes as an int64 array indexed by storage id."""
        return np.array([s.nbytes for s in self.storages], dtype=np.int64)

    @cached_property
    def alloc_ops(self) -> np.ndarray:
        """alloc_op per storage (int64 array)."""
        return np.array([s.alloc_op for s in self.storages], dtype=np.int64)

    @cached_property
    def free_ops(self) -> np.ndarray:
        """free_op per storage (int64 array)."""
        return np.array([s.free_op for s in self.storages], dtype=np.int64)

    @cached_property
    def load(self) -> np.ndarray:
        """Bytes resident while each op runs (int64 array of length num_steps)."""
        delta = np.zeros(self.num_steps + 1, dtype=np.int64)
        np.add.at(delta, self.alloc_ops, self.nbytes)
        np.add.at(delta, self.free_ops, -self.nbytes)
        return np.cumsum(delta)[: self.num_steps]

    @property
    def peak_load_bytes(self) -> int:
        """Largest resident load over the iteration, without any plan."""
        return int(self.load.max()) if self.num_steps else 0

    @property
    def peak_op(self) -> int:
        """First op at which the peak load is reached."""
        return int(self.load.argmax()) if self.num_steps else 0

    def bytes_by_kind(self) -> dict[str, int]:
        """Total bytes of all storages per kind (kinds with no storage are omitted)."""
        out: dict[str, int] = {}
        for s in self.storages:
            out[s.kind] = out.get(s.kind, 0) + s.nbytes
        return out

    # --- accesses and lineage -------------------------------------------------------------

    @cached_property
    def accesses(self) -> tuple[tuple[int, ...], ...]:
        """Per storage, the ascending op indices that read or write it."""
        acc: list[list[int]] = [[] for _ in self.storages]
        for op in self.ops:
            for sid in set(op.reads) | set(op.writes):
                acc[sid].append(op.index)
        return tuple(tuple(a) for a in acc)

    @cached_property
    def writers(self) -> tuple[tuple[int, ...], ...]:
        """Per storage, the ascending op indices that write it."""
        out: list[list[int]] = [[] for _ in self.storages]
        for op in self.ops:
            for sid in set(op.writes):
                out[sid].append(op.index)
        return tuple(tuple(w) for w in out)

    def producer(self, sid: int) -> int | None:
        """The op that first wrote storage `sid` (None for pre-existing storages)."""
        writers = self.writers[sid]
        return writers[0] if writers else None

    def lineage(self, sid: int, before_op: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """What must run again to rebuild `sid` as it was just before op `before_op`.

        Returns:
            (ops, inputs): the ops that wrote `sid` before `before_op` (its producer and
            any in-place updates, in order) and the other storages those ops read, which
            must be resident (or rebuilt first) when the recomputation runs.
        """
        writers = self.writers[sid]
        key = (sid, bisect.bisect_left(writers, before_op))  # the answer depends on the writers before it only
        found = self._lineages.get(key)
        if found is None:
            ops = writers[:key[1]]
            found = self._lineages[key] = (ops, tuple(sorted({r for i in ops for r in self.ops[i].reads if r != sid})))
        return found

    @cached_property
    def _lineages(self) -> dict:
        """`lineage`'s answers by (storage, writers before the op): searches ask the same ones again and again."""
        return {}

    def recomputable(self, sid: int) -> bool:
        """True when `sid` has a producer op inside the trace (so it can be rebuilt), and neither
        it nor what its producers read belongs to a data-parallel engine (see `engine_owned`)."""
        s = self.storages[sid]
        if not self.writers[sid] or s.persistent or s.kind in ("input", "param"):
            return False
        owned = self.engine_owned
        return not owned or (sid not in owned and not any(r in owned for i in self.writers[sid]
                                                           for r in self.ops[i].reads))

    @cached_property
    def engine_owned(self) -> frozenset[int]:
        """Storages DDP or FSDP2 manage themselves: written by a collective or an FSDP op (gradient
        buckets, all-gather and reduce-scatter buffers, unsharded parameters, which FSDP2 frees and
        gathers again itself). No plan may swap or recompute them, nor replay an op reading them."""
        return frozenset(w for op in self.ops if op.name.startswith(ENGINE_OP_PREFIXES) for w in op.writes)

    # --- layer view -------------------------------------------------------------------------

    @cached_property
    def layers(self) -> tuple[Layer, ...]:
        """Consecutive ops of one leaf module in forward or backward, as layers."""
        groups: list[list[Op]] = []
        for op in self.ops:
            if op.phase == "optimizer" or not op.module:
                continue
            last = groups[-1][-1] if groups else None
            if last and last.module == op.module and last.phase == op.phase and last.index == op.index - 1:
                groups[-1].append(op)
            else:
                groups.append([op])
        return tuple(_layer_of(g) for g in groups)

    # --- identity ---------------------------------------------------------------------------

    @cached_property
    def digest(self) -> str:
        """A short hash of storages and op structure: a plan names the trace it was made for."""
        h = hashlib.sha256()
        for s in self.storages:
            h.update(f"{s.nbytes},{s.kind},{s.alloc_op},{s.free_op},{int(s.persistent)};".encode())
        for op in self.ops:
            h.update(f"{op.name},{op.phase},{op.reads},{op.writes};".encode())
        return h.hexdigest()[:16]

    def summary(self) -> dict:
        """The numbers `memplan info` prints."""
        return {
            "ops": len(self.ops),
            "storages": len(self.storages),
            "peak_load_bytes": self.peak_load_bytes,
            "peak_op": self.peak_op,
            "peak_op_name": self.ops[self.peak_op].name if self.ops else None,
            "peak_phase": self.ops[self.peak_op].phase if self.ops else None,
            "bytes_by_kind": self.bytes_by_kind(),
            "ops_by_phase": {p: sum(op.phase == p for op in self.ops) for p in PHASES},
            "total_flops": float(sum(op.flops for op in self.ops)),
            "meta": json.loads(json.dumps(self.meta, default=str)),
        }


def _layer_of(ops: list[Op]) -> Layer:
    written = {w for op in ops for w in op.writes}
    read = {r for op in ops for r in op.reads}
    return Layer(
        module=ops[0].module,
        phase=ops[0].phase,
        ops=tuple(op.index for op in ops),
        inputs=tuple(sorted(read - written)),
        outputs=tuple(sorted(written)),
    )
