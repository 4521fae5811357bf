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
    recompute before op i: replay the ops that wrote it (`chains`), inputs first; in a hooked
              program, run again the module call that made it (`regions`)

A convolution op with decided kernels (`microbatches`) runs them split as decided
(memplan.exec.microconv); its workspace is the kernels' own business.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..budget import NO_LIMIT, bytes_to_json
from ..vocabulary import Vocabulary
from .conv import MicroBatch
from .plan import Decision


class ActionKind(Vocabulary):
    """What the executor does at one point of the step (the module docstring says each one).

    The simulator's kernel emits each as a number (`code`, memplan.sim._codes), and the
    executor runs each by its kind: the one vocabulary both sides of the program share.
    """

    RELEASE = "release"
    PREFETCH = "prefetch"
    RECOMPUTE = "recompute"
    WAIT = "wait"
    SWAP_OUT = "swap_out"
    DROP = "drop"

    @property
    def code(self) -> int:
        """The number the simulator's kernel emits for this kind."""
        return _ACTION_CODES[self]

    @classmethod
    def of_code(cls, code: int) -> ActionKind:
        """The kind the simulator's kernel emitted as `code`."""
        return _ACTIONS_BY_CODE[code]


_ACTION_CODES = {ActionKind.RELEASE: 0, ActionKind.PREFETCH: 1, ActionKind.RECOMPUTE: 2, ActionKind.WAIT: 3,
                 ActionKind.SWAP_OUT: 4, ActionKind.DROP: 5}
_ACTIONS_BY_CODE = {code: kind for kind, code in _ACTION_CODES.items()}


@dataclass(frozen=True, kw_only=True)
class Action:
    """One thing the executor does at one point of the step."""

    op: int  # the op it is attached to
    after: bool  # False: before the op runs; True: after it
    kind: ActionKind  # what it does
    decision: int  # index into StepProgram.decisions


@dataclass(frozen=True, kw_only=True)
class ReplayStep:
    """One storage a recomputation rebuilds by running again the ops that wrote it."""

    storage: int  # storage id
    ops: tuple[int, ...]  # the op indices replayed, in order
    temporary: bool  # an input rebuilt for this recomputation only, dropped when it is done


@dataclass(frozen=True, kw_only=True)
class Rebuild:
    """How one recompute decision rebuilds its storage."""

    steps: tuple[ReplayStep, ...]  # replayed in order, inputs first; the last one rebuilds the storage
    frees: tuple[int, ...] = ()  # temporary inputs (its own or earlier rebuilds') dropped once it is done


PLAIN, HOOKED, INTERPRETED = "plain", "hooked", "interpreted"
LEVELS = (PLAIN, HOOKED, INTERPRETED)  # how the executor runs a program (memplan.sim.lowering)
COMPILED = "compiled"  # no executor: torch.compile runs the plan (memplan.exec.partition)


@dataclass(frozen=True, kw_only=True)
class RegionRun:
    """One module call (a region) run again to recompute storages it saved (a hooked program)."""

    call: int  # index into Trace.calls
    stop: int  # ops [call.first_op, stop) run again: it stops once it saved the last capture
    captures: tuple[tuple[int, int], ...]  # (index into Trace.saved, storage id) taken from the run


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """What the simulation of a step program predicts for one step (`SimResult.summary` as a record)."""

    feasible: bool  # the program fits its budget
    time_s: float | None  # simulated step time (None when infeasible)
    baseline_time_s: float  # the same trace with no plan and no budget
    overhead: float | None  # time / baseline - 1 (None when infeasible)
    peak_load_bytes: int  # largest memory load
    breakdown: dict  # seconds per part (memplan.sim.result.BREAKDOWN_KEYS)
    host_peak_bytes: int  # largest pinned host memory in use at once
    link_bytes: int  # bytes over the host link, both directions
    infeasible_op: int | None  # the op whose allocation could not fit
    shortfall_bytes: int  # by how much it did not fit
    budget_bytes: int  # the cap it was simulated under (memplan.budget.NO_LIMIT: none)
    budget_source: str  # where that cap came from (memplan.budget.BudgetSource)
    level: str = "plain"  # how the executor runs it: plain, hooked or interpreted (memplan.sim.lowering); or compiled
    dropped: int = 0  # hooked: the plan's decisions left out (kept resident)
    level_reason: str = ""  # why the level, or why decisions were dropped

    def to_json(self) -> dict:
        """The JSON object (the keys of `SimResult.summary`)."""
        return {**asdict(self), "budget_bytes": bytes_to_json(self.budget_bytes)}


@dataclass(frozen=True, kw_only=True)
class StepProgram:
    """A plan compiled for one trace, budget and cost model."""

    decisions: tuple[Decision, ...]  # the plan's decisions, indexed by Action.decision
    actions: tuple[Action, ...]  # in execution order
    start_away: tuple[int, ...]  # decisions whose storage is on the host when a step starts
    rebuilds: dict[int, Rebuild] = field(default_factory=dict)  # recompute decision index -> how it rebuilds
    microbatches: tuple[MicroBatch, ...] = ()  # the plan's convolution decisions
    budget_bytes: int = NO_LIMIT  # the budget it was compiled under
    trace_digest: str | None = None  # Trace.digest of its trace
    predicted: Prediction  # the simulation of the program
    level: str = INTERPRETED  # how the executor runs it (LEVELS)
    regions: dict[int, RegionRun] = field(default_factory=dict)  # hooked: recompute decision -> its region run
    holds: dict[int, int] = field(default_factory=dict)  # hooked: storage -> the later free_op a region's hold gives it
    whole_step: bool = False  # hooked: lowered without the hooks inside the optimizer's step (its update marks)

    @property
    def carried_over(self) -> frozenset:
        """Decisions of `start_away` whose swap-out at the step's end is released in the next step (its
        first action there): the storage is on the device, still copying, when a step starts."""
        first: dict[int, ActionKind] = {}
        for a in self.actions:
            first.setdefault(a.decision, a.kind)
        return frozenset(k for k in self.start_away if first.get(k) == ActionKind.RELEASE)

    @property
    def captured_ops(self) -> frozenset:
        """Ops whose calls the executor records in the step, to replay them later."""
        return frozenset(j for rebuild in self.rebuilds.values() for step in rebuild.steps for j in step.ops)

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
