"""Recompute by replay: record the calls of the ops a recomputation will run again, then
run them again, at the op level, into the storage the plan dropped.

While a step runs, the executor records every op of the program's replay chains
(`StepProgram.rebuilds`): the aten overload, its arguments with each tensor replaced by
(trace storage id, view geometry), and the RNG state before a random op. Only weak
references to storages are kept, so recording extends no lifetime. To rebuild a storage it
replays its writers in order: arguments are rebuilt as views of the live storages (inputs
the chain rebuilds temporarily first), a random op runs under the RNG state it first saw,
another storage the op writes in place (batch-norm running statistics) is given as a copy
so the real one is not updated twice, and the new output the plan needs moves into the
dropped storage by swapping data pointers (every alias autograd holds sees it again); a
replay's other new outputs go the same way into storages recomputed at the same op
(memplan.sim.chains says which), the rest are dropped.

NOTE why not torch.utils.checkpoint: a checkpointed region recomputes all its saved
tensors at once, at the first unpack in backward, and regions are modules. A plan
recomputes each storage at its own op, across module boundaries, and the simulator counts
memory that way; replaying single ops is the same mechanism as selective checkpointing
(a dispatch mode that caches or re-runs ops), at the granularity the plan has.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ..model import Trace
from ..model.program import ReplayStep
from ..tracing.opinfo import distinct, leaves, split_tensors, storage_key
from .residency import ExecStats
from .run_state import RngState
from .storage_views import adopt

_NO_RNG = contextlib.nullcontext()  # what a replay of an op that draws no random numbers runs under


# Named tuples, not frozen dataclasses: a replayed op makes several, and a tuple is built
# three times faster (a frozen dataclass sets each field through object.__setattr__).
class _Ref(NamedTuple):
    """A tensor argument: a view of trace storage `sid`."""

    sid: int
    offset: int
    size: tuple
    stride: tuple
    dtype: torch.dtype
    device: torch.device


class _Call(NamedTuple):
    """One recorded op call."""

    func: object  # the aten OpOverload
    args: tuple  # arguments, tensors as _Ref
    kwargs: dict
    written: frozenset  # storages it writes in place (the others it writes are new outputs)
    rng: RngState | None  # the generators' states before the call (random ops only)
    outputs: tuple  # (position among the output's tensors, storage id) of each new output storage


class Replayer:
    """Records the calls of `ops` during a step and replays them on demand (counted in `stats`)."""

    def __init__(self, trace: Trace, ops: frozenset, stats: ExecStats, adopt=None, call=None):
        self.trace = trace
        self.ops = ops
        self.stats = stats
        self.adopt = adopt  # adopt(sid, fresh storage) -> True when another recomputation took the output
        self.call = call or (lambda j, func, args, kwargs: func(*args, **kwargs))  # runs op j (as the step did)
        self.calls: dict[int, _Call] = {}
        self.temporaries: dict[int, torch.UntypedStorage] = {}  # inputs rebuilt for the current op's chains
        self._weak: dict[int, StorageWeakRef] = {}
        self._random: dict = {}  # aten overload -> whether it draws from the generator

    def begin_step(self) -> None:
        """Forget the previous step's calls."""
        self.calls.clear()
        self._weak.clear()

    def rng_before(self, func, args: tuple) -> RngState | None:
        """The generators' states a random op is about to use (None for other ops)."""
        random = self._random.get(func)
        if random is None:
            random = self._random[func] = torch.Tag.nondeterministic_seeded in func.tags
        if not random:
            return None
        return RngState.of(_device_of(args))

    def record(self, index: int, func, args: tuple, kwargs: dict, out, rng) -> None:
        """Remember op `index`'s call (after it ran: its storages are all known then)."""
        op = self.trace.ops[index]
        tensors = split_tensors(func, args, kwargs, out)
        reads, writes = distinct(tensors.reads), distinct(tensors.written + tensors.fresh)  # as storage_roles
        sids = {}
        for sid, t in list(zip(op.reads, reads)) + list(zip(op.writes, writes)):
            sids[storage_key(t)] = sid
            if sid not in self._weak:
                self._weak[sid] = StorageWeakRef(t.untyped_storage())
        in_place = {storage_key(t) for t in tensors.written}

        def ref(t):
            if not isinstance(t, torch.Tensor):
                return t
            return _Ref(sids[storage_key(t)], t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device)

        written = frozenset(sids[k] for k in in_place)
        first = {}
        for position, t in enumerate(leaves(out)):
            if isinstance(t, torch.Tensor):
                first.setdefault(storage_key(t), position)
        outputs = tuple((first[storage_key(t)], w) for w, t in zip(op.writes, writes)
                        if w not in written and storage_key(t) in first)
        self.calls[index] = _Call(func, _map(ref, args), _map(ref, kwargs), written, rng, outputs)

    def can_rebuild(self, steps: tuple[ReplayStep, ...]) -> bool:
        """True when every op the replay runs was recorded in this step."""
        return all(j in self.calls for step in steps for j in step.ops)

    def rebuild(self, steps: tuple[ReplayStep, ...], target: torch.UntypedStorage) -> None:
        """Run `steps` again; the last one's storage ends up in `target` (dropped, 0 bytes).

        Inputs rebuilt temporarily stay available to the same op's later chains, until
        `drop_temporaries` (after the last chain that reads them).
        """
        for step in steps:
            home = None if step.temporary else target
            for j in step.ops:
                self._replay(j, step.storage, home, self.temporaries)

    def drop_temporaries(self, storages=None) -> None:
        """Free inputs rebuilt temporarily: `storages`, or all of them (the op is about to run)."""
        for sid in list(self.temporaries) if storages is None else storages:
            self.temporaries.pop(sid, None)

    def _replay(self, j: int, sid: int, home, temps: dict) -> None:
        call = self.calls.get(j)
        if call is None:
            raise RuntimeError(f"op {j} was not recorded in this step: cannot recompute storage {sid}")
        live = dict(temps)
        if home is not None:
            live[sid] = home

        def tensor(r):
            if not isinstance(r, _Ref):
                return r
            storage = live[r.sid] if r.sid in live else self._storage(r.sid)
            t = _view(storage, r)
            return t.clone() if r.sid in call.written and r.sid != sid else t

        args, kwargs = _map(tensor, call.args), _map(tensor, call.kwargs)
        with call.rng.restored() if call.rng is not None else _NO_RNG:
            out = self.call(j, call.func, args, kwargs)
        self.stats.replayed_ops += 1
        results = leaves(out)
        for position, w in call.outputs:  # new outputs only: what it writes in place stays as it is
            t = results[position]
            if w != sid:  # another new output: taken by a recomputation due now, or dropped
                if self.adopt is not None:
                    self.adopt(w, t.untyped_storage())
            elif home is None:
                temps[sid] = t.untyped_storage()
            else:
                adopt(home, t.untyped_storage())

    def _storage(self, sid: int) -> torch.UntypedStorage:
        weak = self._weak.get(sid)
        if weak is None or weak.expired():
            raise RuntimeError(f"storage {sid}, an input of a recomputation, is gone")
        return torch.UntypedStorage._new_with_weak_ptr(weak.cdata)


def _map(fn, value):
    """`fn` applied to every leaf of an aten call's arguments (tuples, lists and dicts of leaves):
    torch's pytree does the same for any structure, at several times the cost per call. Exact
    types: a _Ref is a tuple too, and a torch.Size holds no tensors."""
    kind = type(value)
    if kind is list:
        return [_map(fn, v) for v in value]
    if kind is tuple:
        return tuple([_map(fn, v) for v in value])
    if kind is dict:
        return {k: _map(fn, v) for k, v in value.items()}
    return fn(value)


def _view(storage: torch.UntypedStorage, r: _Ref) -> torch.Tensor:
    return torch.empty(0, dtype=r.dtype, device=r.device).set_(storage, r.offset, r.size, r.stride)


def _device_of(args) -> torch.device:
    for t in leaves(args):
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")
