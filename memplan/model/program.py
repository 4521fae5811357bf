"""The step program: what the executor does, op by op, to run a plan.

The simulator compiles a Plan into this program while it simulates it
(`memplan.sim.program.compile_program`): every allocation point where it released a
swap-out, every prefetch, wait, recompute, swap-out and drop, in the order it ran them.
The executor runs the same actions at the same points (a dispatch-level point before and
after every op), so the memory it holds at every op is the memory the simulation held.

Actions (a storage's state moves resident -> leaving -> away -> coming -> resident for a
swap, resident -> dropped -> resident for a recompute):
    swap_out  after op i: start copying the storage to its host region
    release   wait until that copy is done, then free the device memory
    prefetch  before op i: allocate the storage again and start copying it back
    wait      before op i: the compute stream waits until the copy back has landed
    drop      after op i: free the storage at once (it will be recomputed)
    recompute before op i: replay the ops that wrote it (`chains`), inputs first

A convolution op with decided kernels (`microbatches`) runs them split as decided
(memplan.exec.microconv); its workspace is the kernels' own business.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .conv import MicroBatch
from .plan import Decision

ACTION_KINDS = ("release", "prefetch", "recompute", "wait", "swap_out", "drop")


@dataclass(frozen=True, kw_only=True)
class Action:
    """One thing the executor does at one point of the step."""

    op: int  # the op it is attached to
    after: bool  # False: before the op runs; True: after it
    kind: str  # one of ACTION_KINDS
    decision: int  # index into StepProgram.decisions


@dataclass(frozen=True, kw_only=True)
class ReplayStep:
    """One storage a recomputation rebuilds by running again the ops that wrote it."""

    storage: int  # storage id
    ops: tuple[int, ...]  # the op indices replayed, in order
    temporary: bool  # an input rebuilt for this recomputation only, dropped when it is done


@dataclass(frozen=True, kw_only=True)
class StepProgram:
    """A plan compiled for one trace, budget and cost model."""

    decisions: tuple[Decision, ...]  # the plan's decisions, indexed by Action.decision
    actions: tuple[Action, ...]  # in execution order
    start_away: tuple[int, ...]  # decisions whose storage is on the host when a step starts
    replays: dict = field(default_factory=dict)  # recompute decision index -> tuple[ReplayStep, ...]
    frees: dict = field(default_factory=dict)  # recompute decision index -> temporary inputs dropped after it
    microbatches: tuple[MicroBatch, ...] = ()  # the plan's convolution decisions
    budget_bytes: int | None = None  # the budget it was compiled under
    trace_digest: str | None = None  # Trace.digest of its trace
    predicted: dict = field(default_factory=dict)  # SimResult summary of the program

    @property
    def captured_ops(self) -> frozenset:
        """Ops whose calls the executor records in the step, to replay them later."""
        return frozenset(j for steps in self.replays.values() for step in steps for j in step.ops)

    def splits(self) -> dict[int, dict[str, tuple[int, ...]]]:
        """Per decided convolution op, the micro-batch sizes of each of its kernels."""
        out: dict[int, dict[str, tuple[int, ...]]] = {}
        for m in self.microbatches:
            out.setdefault(m.op, {})[m.kernel] = m.sizes
        return out

    def actions_at(self) -> dict[tuple[int, bool], tuple[Action, ...]]:
        """Actions grouped by (op, after), each group in execution order."""
        out: dict[tuple[int, bool], list[Action]] = {}
        for a in self.actions:
            out.setdefault((a.op, a.after), []).append(a)
        return {k: tuple(v) for k, v in out.items()}
