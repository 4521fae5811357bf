"""An independent check of a Plan against its Trace, without the simulator's code.

`validate(trace, plan)` reads the trace and the plan alone (semantics in the docstring of
`memplan.model`) and returns every rule the plan breaks as a `Violation`; a valid
plan gives `[]`. It is deliberately a second, separate implementation of the plan
contract, so that the simulator and every planner are checked against it.

Rules (one `Violation.kind` constant each):
- structure: a decision names an existing storage (UNKNOWN_STORAGE); out_after and
  back_before lie inside the storage's lifetime and out_after is at/after its first write
  (OUT_OF_LIFETIME); a wrap-around gap (back_before <= out_after) only for a persistent
  storage (BAD_WRAP); the plan was made for this trace (WRONG_TRACE);
- READ_WHILE_ABSENT: no op reads or writes a storage strictly inside one of its gaps;
- BAD_TRIGGER: a swap's prefetch trigger lies in (out_after, back_before] (circularly);
- OVERLAP_WRITES: a swap whose copy overlaps op out_after (`overlap`) is not written by it;
- OVERLAPPING_GAPS: the gaps of one storage are disjoint;
- NOT_RECOMPUTABLE: recompute only storages with a producer (`Trace.recomputable`);
- ENGINE_OWNED: no decision on a storage DDP or FSDP2 owns (`Trace.engine_owned`: gradient
  buckets, collective buffers, unsharded parameters);
- RECOMPUTE_INPUT_ABSENT: the lineage inputs of a recompute are resident at back_before,
  or can themselves be rebuilt there from resident storages;
- RECOMPUTE_INPUT_OVERWRITTEN: no input of an op that rebuilds a recomputed storage, or an
  input its chain rebuilds on the way, is written again between that op and back_before
  (replaying the op would read the new value: a gradient rebuilt after the optimizer updated a
  weight its chain's backward ops read);
- pool (when the plan has one): every residency interval has a slot (POOL_MISSING_SLOT),
  no slot names an interval that does not exist (POOL_STRAY_SLOT), slots lie inside
  `pool_bytes` (POOL_OUT_OF_RANGE), and slots of intervals alive at once do not share
  bytes (POOL_OVERLAP);
- OVER_BUDGET: the static load (a swap-out released right after out_after, a prefetch
  allocated at its trigger, a recompute allocated at back_before; a lower bound on the
  simulated load) never exceeds the budget; for a plan fixed at the hooked level
  (`Plan.level`), with the decisions no hook can run kept resident, as the executor keeps them
  (memplan.model.hooksites: one rule for the simulator, the validator and the executor);
- POOL_OVER_BUDGET: a pool, when laid out, fits the budget (`pool_bytes` <= budget): the
  budget is the device memory, and the pool is what the plan takes of it.
- BAD_CONV_DECISION: a convolution decision names an op and a kernel that op runs, once,
  its micro-batches sum to the op's batch, and an op's kernels are decided all or none;
  its temporary memory (workspace plus accumulator; the largest of the op's kernels) is
  part of the static load while the op runs.
"""

from __future__ import annotations

import bisect

from ..budget import Budget, budget_given, budget_in_force, limited
from ..model import Decision, Plan, Trace, expect_trace
from ..model.hooksites import HookSites
from ..model.program import HOOKED
from .validate_memory import (check_budget, check_pool, check_pool_budget, conv_temps, residency_intervals,
                              static_load)
from .violations import (BAD_CONV_DECISION, BAD_TRIGGER, BAD_WRAP, ENGINE_OWNED, KINDS, NOT_RECOMPUTABLE,
                         OUT_OF_LIFETIME, OVER_BUDGET, OVERLAP_WRITES, OVERLAPPING_GAPS, POOL_MISSING_SLOT,
                         POOL_OUT_OF_RANGE, POOL_OVER_BUDGET, POOL_OVERLAP, POOL_STRAY_SLOT, READ_WHILE_ABSENT,
                         RECOMPUTE_INPUT_ABSENT, RECOMPUTE_INPUT_OVERWRITTEN, UNKNOWN_STORAGE, WRONG_TRACE, Violation)

__all__ = ["BAD_CONV_DECISION", "BAD_TRIGGER", "BAD_WRAP", "ENGINE_OWNED", "KINDS", "NOT_RECOMPUTABLE", "OUT_OF_LIFETIME",
           "OVER_BUDGET", "OVERLAP_WRITES", "OVERLAPPING_GAPS", "POOL_MISSING_SLOT", "POOL_OUT_OF_RANGE",
           "POOL_OVER_BUDGET", "POOL_OVERLAP", "POOL_STRAY_SLOT", "READ_WHILE_ABSENT", "RECOMPUTE_INPUT_ABSENT",
           "RECOMPUTE_INPUT_OVERWRITTEN", "UNKNOWN_STORAGE", "WRONG_TRACE", "Violation", "residency_intervals",
           "static_load", "validate"]

def validate(trace: Trace, plan: Plan, budget: Budget | int | str | float | None = None) -> list[Violation]:
    """Every rule `plan` breaks on `trace` (see the module docstring); [] when valid.

    Args:
        trace: the trace the plan is for.
        plan: the plan to check.
        budget: bytes or a budget string ("8GiB", "60%", "none"); None uses `plan.budget_bytes`
            (and skips the budget check when that is None too).
    Returns:
        The violations, structural ones first.
    """
    expect_trace(trace, "validate")
    out: list[Violation] = []
    if plan.trace_digest is not None and plan.trace_digest != trace.digest:
        out.append(Violation(kind=WRONG_TRACE, storage=None, op=None,
                             message=f"plan is for trace {plan.trace_digest}, not {trace.digest}"))
    good = [d for d in plan.decisions if not _check_structure(trace, d, out) and not _check_engine(trace, d, out)]
    by_storage: dict[int, list[Decision]] = {}
    for d in sorted(good, key=lambda d: (d.storage, d.out_after, d.back_before)):
        by_storage.setdefault(d.storage, []).append(d)
    for d in good:
        _check_accesses(trace, d, out)
        _check_trigger(trace, d, out)
        _check_overlap_copy(trace, d, out)
    for sid, decisions in by_storage.items():
        _check_overlaps(trace, sid, decisions, out)
    _check_recomputes(trace, good, by_storage, out)
    if plan.pool or plan.pool_bytes is not None:
        check_pool(trace, plan, by_storage, out)
    temps = conv_temps(trace, plan.microbatches, out)
    budget_bytes, _ = budget_in_force(budget_given(budget), plan.budget_bytes, trace.peak_load_bytes)
    if limited(budget_bytes):
        check_budget(trace, _run_at_level(trace, plan, good), budget_bytes, out, temps)
        check_pool_budget(plan.pool_bytes, budget_bytes, out)
    return out


def _run_at_level(trace: Trace, plan: Plan, good: list[Decision]) -> list[Decision]:
    """The decisions that run at the plan's level: at the hooked one, those no hook can run
    (memplan.model.hooksites, the rule the simulator's lowering reads) are left out, resident."""
    if plan.level != HOOKED or not trace.saved or not good:
        return good
    sites = HookSites(trace)
    return [d for d in good if not sites.reason(d)]


def _check_engine(trace: Trace, d: Decision, out: list) -> bool:
    """A storage DDP or FSDP2 owns (buckets, collective buffers, unsharded parameters) is theirs."""
    if d.storage not in trace.engine_owned:
        return False
    out.append(Violation(kind=ENGINE_OWNED, storage=d.storage, op=None,
                         message=f"storage {d.storage} belongs to the data-parallel engine: it cannot be {d.action}ped"
                         if d.action == "swap" else f"storage {d.storage} belongs to the data-parallel engine: "
                         f"it cannot be {d.action}d"))
    return True


# --- gaps -------------------------------------------------------------------------------------


def _absent_at(d: Decision, op: int, n_ops: int) -> bool:
    return any(lo <= op < hi for lo, hi in d.away_ranges(n_ops))


# --- structure --------------------------------------------------------------------------------


def _check_structure(trace: Trace, d: Decision, out: list[Violation]) -> bool:
    """Append structural violations of `d`; True when `d` is too broken to check further."""
    if not 0 <= d.storage < len(trace.storages):
        out.append(Violation(kind=UNKNOWN_STORAGE, storage=d.storage, op=None,
                             message=f"decision names storage {d.storage}, the trace has {len(trace.storages)}"))
        return True
    s = trace.storages[d.storage]
    first = _first_write(trace, d.storage)
    broken = False
    for name, op, lo in (("out_after", d.out_after, first), ("back_before", d.back_before, s.alloc_op)):
        if not lo <= op < s.free_op:
            out.append(Violation(kind=OUT_OF_LIFETIME, storage=d.storage, op=op,
                                 message=f"storage {d.storage}: {name}={op} is outside [{lo}, {s.free_op})"))
            broken = True
    if d.wraps and not s.persistent:
        out.append(Violation(kind=BAD_WRAP, storage=d.storage, op=d.out_after,
                             message=f"storage {d.storage} is not persistent but its gap "
                                     f"({d.out_after} -> {d.back_before}) wraps around the iteration"))
        broken = True
    return broken


def _first_write(trace: Trace, sid: int) -> int:
    """The op that gives `sid` its content: its first writer, or its alloc op when it pre-exists
    (persistent, or read before it is first written)."""
    s, writers, accesses = trace.storages[sid], trace.writers[sid], trace.accesses[sid]
    if writers and not s.persistent and accesses[0] == writers[0]:
        return max(s.alloc_op, writers[0])
    return s.alloc_op


def _check_accesses(trace: Trace, d: Decision, out: list[Violation]) -> None:
    accesses = trace.accesses[d.storage]
    for lo, hi in d.away_ranges(trace.num_steps):
        i = bisect.bisect_left(accesses, lo)
        if i < len(accesses) and accesses[i] < hi:
            out.append(Violation(kind=READ_WHILE_ABSENT, storage=d.storage, op=accesses[i],
                                 message=f"op {accesses[i]} accesses storage {d.storage} while it is away "
                                         f"({d.action} after op {d.out_after}, back before op {d.back_before})"))
            return


def _check_trigger(trace: Trace, d: Decision, out: list[Violation]) -> None:
    if d.action != "swap" or d.trigger is None:
        return
    n, t = trace.num_steps, d.trigger
    if d.wraps:
        ok = 0 <= t < n and (t > d.out_after or t <= d.back_before)
    else:
        ok = d.out_after < t <= d.back_before
    if not ok:
        out.append(Violation(kind=BAD_TRIGGER, storage=d.storage, op=t,
                             message=f"storage {d.storage}: trigger {t} is not in "
                                     f"({d.out_after}, {d.back_before}]"))


def _check_overlap_copy(trace: Trace, d: Decision, out: list[Violation]) -> None:
    """A copy that starts beside op out_after must not race a write of that op."""
    if d.overlap and (d.action != "swap" or d.storage in trace.ops[d.out_after].writes):
        out.append(Violation(kind=OVERLAP_WRITES, storage=d.storage, op=d.out_after,
                             message=f"storage {d.storage}: its copy overlaps op {d.out_after}, which "
                                     f"{'writes it' if d.action == 'swap' else 'is before a recompute'}"))


def _check_overlaps(trace: Trace, sid: int, decisions: list[Decision], out: list[Violation]) -> None:
    """Two gaps overlap when one's away ops meet the other's, or one's endpoint is inside the other."""
    n = trace.num_steps
    for i, a in enumerate(decisions):
        for b in decisions[i + 1:]:
            clash = a.out_after == b.out_after or _absent_at(a, b.out_after, n) or _absent_at(a, b.back_before, n) \
                or _absent_at(b, a.out_after, n) or _absent_at(b, a.back_before, n) \
                or _ranges_meet(a.away_ranges(n), b.away_ranges(n))
            if clash:
                out.append(Violation(kind=OVERLAPPING_GAPS, storage=sid, op=b.out_after,
                                     message=f"storage {sid}: gaps ({a.out_after} -> {a.back_before}) and "
                                             f"({b.out_after} -> {b.back_before}) overlap"))
                return


def _ranges_meet(xs: list[tuple[int, int]], ys: list[tuple[int, int]]) -> bool:
    return any(max(a0, b0) < min(a1, b1) for a0, a1 in xs for b0, b1 in ys)


# --- recompute --------------------------------------------------------------------------------


def _check_recomputes(trace: Trace, good: list[Decision], by_storage: dict[int, list[Decision]],
                      out: list[Violation]) -> None:
    rebuild = _Rebuilder(trace, by_storage)
    for d in good:
        if d.action != "recompute":
            continue
        if not trace.recomputable(d.storage):
            out.append(Violation(kind=NOT_RECOMPUTABLE, storage=d.storage, op=d.out_after,
                                 message=f"storage {d.storage} ({trace.storages[d.storage].kind}) has no "
                                         f"producer in the trace and cannot be recomputed"))
            continue
        missing = rebuild.missing_inputs(d.storage, d.back_before)
        # an input the chain would rebuild but whose own replay reads data written since is missing too
        nested = None if missing is None else _overwritten_input(trace, missing, d.back_before)
        if missing is not None and nested is None:
            out.append(Violation(kind=RECOMPUTE_INPUT_ABSENT, storage=d.storage, op=d.back_before,
                                 message=f"recomputing storage {d.storage} before op {d.back_before} needs "
                                         f"storage {missing}, which is neither resident nor rebuildable there"))
        overwritten = _overwritten_input(trace, d.storage, d.back_before) or nested
        if overwritten is not None:
            r, j, w = overwritten
            out.append(Violation(kind=RECOMPUTE_INPUT_OVERWRITTEN, storage=d.storage, op=w,
                                 message=f"recomputing storage {d.storage} before op {d.back_before} replays op {j}, "
                                         f"whose input storage {r} is written again by op {w}"))


def _overwritten_input(trace: Trace, sid: int, t: int) -> tuple[int, int, int] | None:
    """(input, replayed op, later writer) of the first input of a writer of `sid` before op `t`
    that some op writes again after it and before `t`; None when there is none."""
    for j in trace.lineage(sid, t)[0]:
        for r in trace.ops[j].reads:
            later = [w for w in trace.writers[r] if j < w < t] if r != sid else []
            if later:
                return r, j, later[0]
    return None


class _Rebuilder:
    """Answers "can storage s be rebuilt before op t from what is resident then?"."""

    def __init__(self, trace: Trace, by_storage: dict[int, list[Decision]]):
        self.trace = trace
        self.by_storage = by_storage
        self.memo: dict[tuple[int, int], int | None] = {}

    def resident(self, sid: int, t: int) -> bool:
        """In its lifetime at op t, and not inside one of its own gaps (it is back at back_before)."""
        s = self.trace.storages[sid]
        if not s.alloc_op <= t < s.free_op:
            return False
        return not any(_absent_at(d, t, self.trace.num_steps) for d in self.by_storage.get(sid, ()))

    def missing_inputs(self, sid: int, t: int) -> int | None:
        """The first lineage input of `sid` at `t` that can be neither found nor rebuilt; None if all can.

        Iterative depth-first search (lineages can be long); a storage on the current path
        counts as missing, so an in-place cycle cannot loop.
        """
        stack, on_path = [(sid, iter(self.trace.lineage(sid, t)[1]))], {sid}
        while stack:
            node, inputs = stack[-1]
            child = next(inputs, None)
            if child is None:
                stack.pop()
                on_path.discard(node)
                self.memo[(node, t)] = None
                continue
            verdict = self._quick(child, t, on_path)
            if verdict == "ok":
                continue
            if verdict == "bad":
                self._fail_path(stack, t, child)
                return child
            stack.append((child, iter(self.trace.lineage(child, t)[1])))
            on_path.add(child)
        return None

    def _quick(self, r: int, t: int, on_path: set[int]) -> str:
        if self.resident(r, t) or (r, t) in self.memo and self.memo[(r, t)] is None:
            return "ok"
        if r in on_path or (r, t) in self.memo or not self.trace.recomputable(r) or not self._rebuild_allowed(r, t) \
                or _overwritten_input(self.trace, r, t) is not None:
            return "bad"
        return "descend"

    def _rebuild_allowed(self, r: int, t: int) -> bool:
        """A storage swapped out at t holds data on the host only: it is not rebuilt, it is late."""
        return not any(d.action == "swap" and _absent_at(d, t, self.trace.num_steps)
                       for d in self.by_storage.get(r, ()))

    def _fail_path(self, stack: list, t: int, culprit: int) -> None:
        for node, _ in stack:
            self.memo[(node, t)] = culprit
