"""From (trace, plan) to what the executor does at run time.

The plan speaks in trace op indices and storage ids; at run time there are autograd
saved-tensor packs, module calls and aten ops. This module does the translation once:

- Swaps act on saved tensors: the k-th pack of a run is the k-th pack of the trace
  (`trace.meta["pack_order"]` holds its storage id, `trace.meta["pack_ops"]` the op it
  happened in). A swap decision is executable when its storage is packed and its gap runs
  from the forward pass into the backward pass; the executor offloads at the pack and
  prefetches at the decision's trigger.
- Triggers become (leaf module, backward occurrence) keys: the prefetch is issued when the
  gradient of that module call's output is ready, i.e. when its backward starts. A trigger
  op that no leaf module owns moves to the nearest earlier one that has (earlier is safe;
  it only holds memory sooner).
- Recompute decisions become checkpoint regions (the smallest module containing the
  storage's producer and its forward readers) and a selective-checkpoint policy keyed by
  (module, aten op, occurrence).
- Swaps of storages an owner keeps referencing (parameters, buffers, gradients, optimizer
  state), gaps that wrap around the iteration boundary, later gaps of one storage and
  activation gaps that do not run from forward into backward run at the storage level,
  at hook points (storage_schedule.py).
Anything a decision asks that these mechanisms cannot do is listed in `skipped` with the
reason and kept resident instead (never run wrongly).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from ..errors import MemplanError
from ..model import Decision, Plan, Trace
from .slab import ALIGN, align_up
from .storage_schedule import StorageSchedule, build_storage_schedule, is_storage_level

OpKey = tuple  # (module path, aten op name, occurrence among forward ops with that module and name)
TriggerKey = tuple  # (leaf module path, backward occurrence); BACKWARD_START = at the first backward event
BACKWARD_START: TriggerKey = ("", -1)


@dataclass(frozen=True, kw_only=True)
class SwapSpec:
    """How one storage is swapped while its saved tensor waits for the backward pass."""

    storage: int  # trace storage id
    nbytes: int  # trace size in bytes
    sync: bool  # the compute stream waits for the swap-out (vDNN)
    compress_ratio: float | None  # zero-value compression when set
    reserve_bytes: int  # host slab bytes reserved for it
    trigger: TriggerKey  # where the prefetch is issued


@dataclass(frozen=True, kw_only=True)
class RecomputeSpec:
    """Checkpoint regions and the selective policy inside them."""

    regions: tuple[str, ...]  # module paths whose forward runs under non-reentrant checkpoint
    recompute_keys: frozenset  # op keys whose outputs are recomputed because the plan says so
    save_keys: frozenset  # op keys whose outputs autograd saves and the plan keeps
    known_keys: frozenset  # every forward op key of the trace
    storages: tuple[int, ...]  # storages recomputed


@dataclass(frozen=True, kw_only=True)
class ExecSchedule:
    """Everything the executor needs, in run-time terms."""

    pack_sids: tuple[int, ...]  # storage id of each pack the swap hooks will see, in order
    swaps: dict  # storage id -> SwapSpec
    recompute: RecomputeSpec | None  # None when the plan recomputes nothing executable
    skipped: tuple  # (Decision, reason) pairs executed as "keep"
    slab_bytes: int  # host slab size
    storage: StorageSchedule | None = None  # storage-level swaps (parameters, state, gradients)

    @property
    def trigger_modules(self) -> frozenset:
        """Leaf modules whose backward start issues prefetches."""
        return frozenset(s.trigger[0] for s in self.swaps.values() if s.trigger != BACKWARD_START)


def build_schedule(trace: Trace, plan: Plan, modules=None) -> ExecSchedule:
    """Translate `plan` for `trace` into run-time actions.

    Args:
        trace: the traced iteration (with meta "pack_order" and "pack_ops").
        plan: a plan made for it.
        modules: paths of the modules that can be wrapped as checkpoint regions (those
            with a forward of their own; see `region_modules`); None: none can, so recompute
            decisions are skipped.

    Raises:
        MemplanError: the plan has decisions but the trace has no pack record.
    """
    if plan.trace_digest and plan.trace_digest != trace.digest:
        raise MemplanError(f"plan was made for trace {plan.trace_digest}, not this one ({trace.digest})")
    owned = [d for d in plan.decisions if d.action == "swap" and _valid(trace, d.storage)
             and is_storage_level(trace, d.storage)]
    if len(owned) < sum(d.action == "swap" for d in plan.decisions) and "pack_order" not in trace.meta:
        raise MemplanError("the trace has no saved-tensor pack record (meta 'pack_order'); re-trace it with memplan")
    pack_order = tuple(int(s) for s in trace.meta.get("pack_order", ()))
    pack_ops = tuple(int(o) for o in trace.meta.get("pack_ops", range(len(pack_order))))
    skipped: list = []
    recompute = _recompute_spec(trace, plan, set(pack_order), skipped, modules)
    regions = recompute.regions if recompute else ()
    # pack_ops[k] counts the ops recorded before pack k: the pack belongs to the op before.
    seen = [k for k, op in enumerate(pack_ops) if not _inside(trace.ops[max(op - 1, 0)].module, regions)] \
        if trace.ops else list(range(len(pack_order)))
    pack_sids = tuple(pack_order[k] for k in seen)
    first_pack: dict[int, int] = {}
    for k in seen:
        first_pack.setdefault(pack_order[k], pack_ops[k])
    by_hooks, by_storage = _route(trace, plan, first_pack, skipped)
    swaps = _swap_specs(trace, by_hooks)
    storage = build_storage_schedule(trace, by_storage, skipped, regions, first_pack) if by_storage else None
    slab = sum(s.reserve_bytes for s in swaps.values())
    return ExecSchedule(pack_sids=pack_sids, swaps=swaps, recompute=recompute, skipped=tuple(skipped),
                        slab_bytes=slab, storage=storage if storage is not None and storage.swaps else None)


def _valid(trace: Trace, sid: int) -> bool:
    return 0 <= sid < len(trace.storages)


# --- swaps ------------------------------------------------------------------------------------


def _route(trace: Trace, plan: Plan, first_pack: dict, skipped: list) -> tuple[list, list]:
    """Swap decisions by executor: (saved-tensor hooks, storage level); bad ids go to `skipped`.

    An activation with one gap that starts in forward and ends in backward is sent away at
    its pack and fetched for its unpack. Every other swap runs at the storage level:
    storages an owner holds (parameters, state, gradients), and activations with several
    gaps or a gap the hooks cannot see (all gaps of one storage go the same way).
    """
    groups: dict[int, list[Decision]] = {}
    for d in sorted(plan.decisions, key=lambda d: (d.storage, d.out_after)):
        if d.action == "swap":
            groups.setdefault(d.storage, []).append(d)
    by_hooks, by_storage = [], []
    for sid, ds in groups.items():
        if not _valid(trace, sid):
            skipped += [(d, "no such storage") for d in ds]
        elif is_storage_level(trace, sid) or len(ds) > 1 or _swap_problem(trace, ds[0], first_pack):
            by_storage += ds
        else:
            by_hooks += ds
    return by_hooks, by_storage


def _swap_specs(trace: Trace, decisions: list) -> dict:
    leaves = _leaf_modules(trace)
    specs: dict[int, SwapSpec] = {}
    for d in decisions:
        nbytes = trace.storages[d.storage].nbytes
        specs[d.storage] = SwapSpec(storage=d.storage, nbytes=nbytes, sync=d.sync, compress_ratio=d.compress_ratio,
                                    reserve_bytes=reserve_bytes(nbytes, d.compress_ratio),
                                    trigger=trigger_key(trace, d.prefetch_at, leaves))
    return specs


def _swap_problem(trace: Trace, d: Decision, first_pack: dict) -> str:
    """Why decision `d` cannot run through the saved-tensor hooks ("" when it can)."""
    if d.wraps:
        return "cross-iteration gap"
    if d.storage not in first_pack:
        return "not saved for backward (no pack), or packed inside a recompute region"
    if trace.ops and trace.ops[min(d.back_before, len(trace.ops) - 1)].phase != "backward":
        return "gap does not end in the backward pass"
    return ""


def reserve_bytes(nbytes: int, compress_ratio: float | None) -> int:
    """Host slab bytes reserved for one swapped storage (compressed: bitmask and values apart)."""
    if compress_ratio is None:
        return align_up(nbytes)
    return min(align_up(nbytes), align_up(math.ceil(nbytes * compress_ratio)) + ALIGN)


def trigger_key(trace: Trace, op_index: int, leaves: frozenset) -> TriggerKey:
    """The (leaf module, backward occurrence) whose backward start is at or before `op_index`."""
    ops = trace.ops
    t = min(op_index, len(ops) - 1)
    while t >= 0 and ops[t].phase == "backward" and ops[t].module not in leaves:
        t -= 1
    if t < 0 or ops[t].phase != "backward":
        return BACKWARD_START
    module = ops[t].module
    runs, prev = 0, None
    for op in ops[: t + 1]:
        if op.phase == "backward" and op.module == module and (prev is None or prev.module != module):
            runs += 1
        prev = op if op.phase == "backward" else prev
    return (module, runs - 1)


def _leaf_modules(trace: Trace) -> frozenset:
    """Module paths that no other traced module path lies under."""
    paths = {op.module for op in trace.ops if op.module}
    return frozenset(p for p in paths if not any(q.startswith(p + ".") for q in paths))


# --- recompute -------------------------------------------------------------------------------


def op_keys(trace: Trace) -> dict:
    """Forward op index -> (module, name, occurrence) key."""
    seen: Counter = Counter()
    keys = {}
    for op in trace.ops:
        if op.phase != "forward":
            continue
        keys[op.index] = (op.module, op.name, seen[(op.module, op.name)])
        seen[(op.module, op.name)] += 1
    return keys


def _recompute_spec(trace: Trace, plan: Plan, packed: set, skipped: list, modules) -> RecomputeSpec | None:
    chosen, regions = [], set()
    for d in plan.decisions:
        if d.action != "recompute":
            continue
        reason, region = _recompute_problem(trace, d)
        if not reason:
            reason, region = _region(region, modules)
        if reason:
            skipped.append((d, reason))
            continue
        chosen.append(d.storage)
        regions.add(region)
    if not chosen:
        return None
    regions = {r for r in regions if not any(_inside(r, [a]) and a != r for a in regions)}
    recomputed, answers = classify_ops(trace, set(chosen), packed)
    keys = op_keys(trace)
    rec_keys = {keys[i] for i, again in answers.items() if again and i in keys}
    save_keys = {keys[i] for i, again in answers.items() if not again and i in keys}
    return RecomputeSpec(regions=tuple(sorted(regions)), recompute_keys=frozenset(rec_keys),
                         save_keys=frozenset(save_keys), known_keys=frozenset(keys.values()),
                         storages=tuple(sorted(s for s in recomputed
                                               if _inside(trace.ops[trace.producer(s)].module, regions))))


def region_modules(model) -> set:
    """Paths of `model`'s submodules that can be checkpoint regions: called through a forward.

    The root is excluded (see `_region`), and so are containers without a forward
    (ModuleList, ModuleDict), which their parents index instead of calling.
    """
    import torch

    unimplemented = torch.nn.Module.forward
    return {name for name, m in model.named_modules() if name and type(m).forward is not unimplemented}


def _region(path: str, modules) -> tuple[str, str]:
    """(reason it cannot run, "") or ("", the checkpoint region for common module `path`).

    A region is a module whose forward is called (a ModuleList is not: climb to its
    parent), never the root: the root's own ops carry module "" in the trace, like the
    code outside the model (the loss), so their keys would be ambiguous, and one region
    around the whole model recomputes everything at once and saves nothing.
    """
    if modules is None:
        return "no model to checkpoint (pass the model)", ""
    while path and path not in modules:
        path = path.rpartition(".")[0]
    if not path:
        return "spans top-level modules: no module below the root holds it (kept)", ""
    return "", path


def classify_ops(trace: Trace, chosen: set, packed: set) -> tuple[set, dict]:
    """Which forward ops run again in recomputation, consistently for in-place updates.

    An op is recomputed when it writes a recomputed storage, cached (MUST_SAVE) when it
    writes a storage autograd saves and the plan keeps, and recomputed otherwise (its
    outputs are not needed by backward). Random ops are always cached. Then, to a fixed point:

    - every forward writer of one storage gets the same answer: selective checkpointing
      replays a cached in-place op by returning its cached result, without mutating the
      recomputed tensor that later recomputed readers take (e.g. conv -> bn -> relu_ with
      bn recomputed for its saved statistics and relu_ cached: the conv after it would read
      the un-rectified batch-norm output). A storage whose writers disagree is recomputed.
    - a kept storage updated in place holds only its final value in the cache; if a
      recomputed op reads it between its first and last forward writers, it is recomputed.

    Args:
        trace: the trace.
        chosen: storages the plan recomputes.
        packed: storages autograd saved (the pack record).
    Returns:
        (recomputed storages, {forward op index: True to recompute, False to cache}).
    """
    fwd = [op for op in trace.ops if op.phase == "forward"]
    random_ops = {op.index for op in fwd if is_random_op(op.name)}
    pinned = {s for op in fwd if op.index in random_ops for s in op.writes}
    multi = {sid: w for sid in {s for op in fwd for s in op.writes}
             if len(w := [i for i in trace.writers[sid] if trace.ops[i].phase == "forward"]) > 1}
    recomputed = set(chosen) - pinned
    while True:
        answers = {op.index: _runs_again(op, recomputed, packed, pinned, random_ops) for op in fwd}
        grow = {sid for sid, w in multi.items() if sid not in recomputed and sid not in pinned
                and _inconsistent(trace, sid, w, answers)}
        if not grow:
            return recomputed, answers
        recomputed |= grow


def _runs_again(op, recomputed: set, packed: set, pinned: set, random_ops: set) -> bool:
    writes = set(op.writes)
    if op.index in random_ops or writes & pinned:
        return False
    return bool(writes & recomputed) or not writes & packed


def _inconsistent(trace: Trace, sid: int, writers: list, answers: dict) -> bool:
    if len({answers[i] for i in writers}) > 1:
        return True
    if answers[writers[0]]:
        return False
    between = (i for i in trace.accesses[sid] if writers[0] < i < writers[-1] and i not in writers)
    return any(answers.get(i, False) for i in between)


def _recompute_problem(trace: Trace, d: Decision) -> tuple[str, str]:
    """(reason it cannot run, "") or ("", checkpoint region path)."""
    if not (0 <= d.storage < len(trace.storages)) or not trace.recomputable(d.storage):
        return "storage has no producer inside the iteration", ""
    if d.wraps:
        return "cross-iteration recompute is not executable", ""
    writers = [i for i in trace.writers[d.storage] if trace.ops[i].phase == "forward"]
    if not writers:
        return "not produced in the forward pass", ""
    if any(is_random_op(trace.ops[i].name) for i in writers):
        return "written by a random op (its RNG draw cannot be replayed alone)", ""
    readers = [i for i in trace.accesses[d.storage] if trace.ops[i].phase == "forward"]
    return "", common_module([trace.ops[i].module for i in writers + readers])


def is_random_op(name: str) -> bool:
    """True for an aten op name ("aten.bernoulli_.float") tagged nondeterministic_seeded."""
    import torch

    parts = name.split(".")
    try:
        op = getattr(getattr(torch.ops, parts[0]), parts[1])
        overload = getattr(op, parts[2] if len(parts) > 2 else "default")
    except (AttributeError, IndexError, RuntimeError):
        return False
    return torch.Tag.nondeterministic_seeded in overload.tags


def common_module(paths) -> str:
    """The deepest module path containing all `paths` ("" is the root)."""
    parts = [p.split(".") if p else [] for p in paths]
    common = []
    for level in zip(*parts):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    return ".".join(common)


def _inside(module: str, regions) -> bool:
    return any(r == "" or module == r or module.startswith(r + ".") for r in regions)
