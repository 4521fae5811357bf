"""Where a storage the step program moves is, and what the runner did with storages.

A swap moves a storage resident -> leaving -> away -> coming -> resident; a recomputation
resident -> dropped -> resident (memplan.model.program).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..vocabulary import Vocabulary
from .hostcopy import HostCopy


class Residency(Vocabulary):
    """Where a storage the program moves is."""

    RESIDENT = "resident"  # on the device, as the step needs it
    LEAVING = "leaving"  # its copy to the host is under way; its device memory not yet freed
    AWAY = "away"  # on the host only (its device storage has 0 bytes)
    COMING = "coming"  # allocated again, its copy back under way
    DROPPED = "dropped"  # freed, to be recomputed


@dataclass(eq=False, kw_only=True)
class MovedStorage:
    """One storage the program moves, and where it is now."""

    sid: int  # trace storage id
    nbytes: int  # its size in the trace (as the device's allocator counts it)
    real_nbytes: int = 0  # its size as a storage (set when it is first found)
    dtype: str | None  # its traced dtype (for compression)
    state: Residency = Residency.RESIDENT
    storage: torch.UntypedStorage | None = None  # held while not resident
    decision: int = -1  # the decision of its current gap (its host region)
    d2h: object = None  # ticket of the last swap-out
    h2d: object = None  # ticket of the last prefetch
    host_copy: HostCopy | None = None  # where its host copy is and how it is laid out


@dataclass(kw_only=True)
class ExecStats:
    """What the runner did, over all steps."""

    steps: int = 0  # steps begun
    swapped_out: int = 0  # swap-outs started
    swapped_out_bytes: int = 0  # their bytes
    copied_beside: int = 0  # of them, copies started before the op they follow (Decision.overlap)
    released: int = 0  # swap-outs whose device memory was freed
    release_wait_s: float = 0.0  # host time spent waiting for a swap-out copy at a release
    prefetched: int = 0  # prefetches issued at their point
    late_prefetches: int = 0  # prefetches issued only at the wait (their point was missed)
    kept: int = 0  # prefetches due before their swap-out was released: the bytes simply stayed
    prefetch_wait_s: float = 0.0  # time spent waiting for prefetches to land
    dropped: int = 0  # storages dropped for recomputation
    recomputed: int = 0  # storages rebuilt by replaying their ops
    start_sent: int = 0  # storages sent to host at a step start (first step, or after a restore)
    restored: int = 0  # storages brought back outside the program (restore, divergence, close)
    diverged_steps: int = 0  # steps that left the traced program (the rest ran unplanned)
    aborted_steps: int = 0  # steps an exception cut short (their graph is gone: nothing is rebuilt)
    skipped_ops: int = 0  # trace ops the run did not make (their actions ran without their tensors)
    inserted_ops: int = 0  # ops the run made that the trace does not have (ran unplanned)
    unresolved: int = 0  # actions not done: storage not found or not as traced (kept resident)
    link_bytes: int = 0  # bytes over the host link, both directions (before compression)
    ops_in_mode: int = 0  # ops that went through the interpreted runner's dispatch mode
    regions_recomputed: int = 0  # module calls run again to recompute (hooked runner)
    late_unpacks: int = 0  # saved tensors autograd unpacked before the program brought them back
    host_s: float = 0.0  # seconds the hooked runner's hooks took (its host work)
    hook_calls: int = 0  # calls of the hooked runner's hooks in steps (packs, unpacks, module calls, marks)
    replayed_ops: int = 0  # ops replayed one by one to recompute storages (interpreted runner: memplan.exec.op_replay)
    record_s: float = 0.0  # seconds the interpreted runner took to record the ops it may replay (memplan.exec.op_replay)
