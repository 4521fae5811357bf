"""The plan: where every storage lives, and the explicit schedule that implies.

A storage with no decision is kept resident for its whole lifetime. Each Decision takes
one storage out of device memory for one gap between two of its accesses:

    swap       after op `out_after` the storage is copied to host (device-to-host engine)
               and its device memory is released when the copy completes (or, if `sync`,
               the compute stream waits for that copy before the next op). With `overlap`
               the copy starts already when op `out_after` starts, beside it (that op only
               reads the storage: vDNN offloads a layer's input during the layer). At op `trigger`
               the prefetch is issued: its bytes are allocated then, the copy runs on the
               host-to-device engine, and op `back_before` waits for it to land.
    recompute  after op `out_after` the storage is freed at once; right before op
               `back_before` its producer chain (Trace.lineage) runs again on the compute
               stream.

A gap with out_after >= back_before wraps around the iteration boundary (cross-iteration
swaps of weights and optimizer state): the storage is away from op out_after+1 to the end
of the iteration and from op 0 up to back_before in the next one.
A storage may have several decisions for disjoint gaps (multi-swap).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import asdict, dataclass, field, fields, replace

from ..budget import NO_LIMIT, bytes_from_json, bytes_to_json
from ..errors import TraceFormatError
from .conv import MicroBatch


class Action(enum.IntEnum):
    """What a plan does with a storage over one gap between two of its accesses: the one vocabulary
    of planners, plans and the simulator. Its number is what a planner's arrays hold (HOME's
    numbering, paper 004 §3.3: a policy value, a ledger's decision); its `word` is what a Decision
    and a plan file say (keeping needs no decision)."""

    KEEP = 0
    SWAP = 1
    RECOMPUTE = 2

    @property
    def word(self) -> str:
        """As a Decision and a plan file write it: "keep", "swap" or "recompute"."""
        return self.name.lower()

    @classmethod
    def of(cls, word: str) -> Action:
        """The action a Decision's word names."""
        return cls[word.upper()]


ACTIONS = (Action.SWAP.word, Action.RECOMPUTE.word)  # a Decision's actions
PLAN_SCHEMA = "memplan.plan"
PLAN_VERSION = 1
LEVEL_CHOICES = ("", "plain", "hooked", "interpreted")  # Plan.level (memplan.model.program.LEVELS, or none yet)


ROW = struct.Struct("<8d")  # Decision.row: storage, recompute, out_after, back_before, trigger, sync, overlap,
# compress_ratio (0.0: off)
NO_TRIGGER = -1  # Decision.row's trigger when the Decision has none


class _Row:
    """The slot that holds a Decision's row: not a dataclass field, so neither compared, hashed nor written."""

    __slots__ = ("row",)


# Slots: a search's simulator reads every field of a few hundred Decisions per plan, and a slotted
# object is read ~30% faster when the plan is new (one allocation, no instance dict: fewer cache misses).
@dataclass(frozen=True, kw_only=True, slots=True)
class Decision(_Row):
    """One storage leaves device memory after one op and is back before a later one."""

    storage: int  # storage id
    action: str  # "swap" or "recompute"
    out_after: int  # the last op that touches it before the gap
    back_before: int  # the next op that touches it (wraps around when <= out_after)
    trigger: int | None = None  # swap only: op at whose start the prefetch is issued (default back_before)
    sync: bool = False  # swap only: the compute stream waits for the swap-out (vDNN)
    overlap: bool = False  # swap only: the copy may start when op out_after starts (it only reads the storage)
    compress_ratio: float | None = None  # zero-value compression: compressed/original bytes; None = off

    def __post_init__(self):
        if self.action not in ACTIONS:
            raise ValueError(f"decision for storage {self.storage}: action {self.action!r} is not one of {ACTIONS}")
        if self.compress_ratio is not None and not 0.0 < self.compress_ratio <= 1.0:
            raise ValueError(f"decision for storage {self.storage}: compress_ratio must be in (0, 1]")
        self._pack()

    def __setstate__(self, state: list) -> None:
        """A copied or unpickled Decision (a worker's): its fields, as the dataclass wrote them, then its row."""
        for f, value in zip(fields(self), state):
            object.__setattr__(self, f.name, value)
        self._pack()

    def _pack(self) -> None:
        # Its fields as numbers, packed once: a search simulates the same Decision in thousands of plans, and
        # joining these rows is ~5x faster than reading seven fields of each (memplan.sim.decisions).
        object.__setattr__(self, "row", ROW.pack(
            self.storage, self.action == "recompute", self.out_after, self.back_before,
            NO_TRIGGER if self.trigger is None else self.trigger, self.sync, self.overlap, self.compress_ratio or 0.0))

    @property
    def wraps(self) -> bool:
        """True for a gap across the iteration boundary."""
        return self.back_before <= self.out_after

    def away_at(self, op: int) -> bool:
        """The storage is away while op `op` runs: strictly between out_after and back_before (across
        the iteration boundary where the gap wraps)."""
        return (op > self.out_after or op < self.back_before) if self.wraps else self.out_after < op < self.back_before

    def away_ranges(self, n_ops: int, until: int | None = None) -> list[tuple[int, int]]:
        """Half-open op ranges during which the storage is away, from out_after+1 up to `until`.

        `until` defaults to back_before (the data is absent); pass the prefetch op for the
        span during which its device bytes are released. A gap across the iteration
        boundary is split at the iteration's end.
        """
        end = self.back_before if until is None else until
        start = self.out_after + 1
        if self.wraps and not start <= end:
            return [r for r in ((start, n_ops), (0, end)) if r[0] < r[1]]
        return [(start, end)] if start < end else []

    @property
    def prefetch_at(self) -> int:
        """The op at whose start the prefetch is issued (swap) or the recompute runs."""
        return self.back_before if self.trigger is None or self.action == "recompute" else self.trigger


@dataclass(frozen=True, kw_only=True)
class PoolSlot:
    """Where one residency interval of a storage sits in the pool."""

    storage: int  # storage id
    start: int  # first op of the residency interval (its alloc op, prefetch trigger or recompute op)
    offset: int  # byte offset in the pool


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A planner's answer for one trace and budget."""

    decisions: tuple[Decision, ...] = ()  # swaps and recomputes; everything else is kept
    pool: tuple[PoolSlot, ...] = ()  # planned offsets, when a pool was laid out
    pool_bytes: int | None = None  # size of the pool block, when laid out
    microbatches: tuple[MicroBatch, ...] = ()  # how convolution kernels run (memplan.model.conv)
    planner: str = "none"  # registry name of the planner that made it
    params: dict = field(default_factory=dict)  # the planner's hyper-parameters
    seed: int | None = None  # the seed the planner used
    budget_bytes: int = NO_LIMIT  # the budget the plan was made for (memplan.budget.NO_LIMIT: none)
    profile: dict = field(default_factory=dict)  # the cost model's profile it was planned for (JSON); {} unknown
    trace_digest: str | None = None  # Trace.digest of the trace it was made for
    predicted: dict = field(default_factory=dict)  # simulator summary at planning time
    planning_s: float = 0.0  # wall-clock seconds the planner took
    history: dict = field(default_factory=dict)  # a search's convergence per step, for `memplan plan --plot`
    report: dict = field(default_factory=dict)  # what the planner says of its answer (a solver's objective, bound, gap)
    level: str = ""  # the executor level it runs at, fixed when it was planned (memplan.sim.simulate); "": not
    # yet (the simulator decides it under the budget in force)

    def with_meta(self, **changes) -> "Plan":
        """A copy with some fields replaced."""
        return replace(self, **changes)

    def by_storage(self) -> dict[int, list[Decision]]:
        """Decisions grouped by storage id, each list in order of out_after."""
        out: dict[int, list[Decision]] = {}
        for d in sorted(self.decisions, key=lambda d: (d.storage, d.out_after)):
            out.setdefault(d.storage, []).append(d)
        return out

    def to_json(self) -> dict:
        """A JSON-ready dict with schema and version (no budget written as null)."""
        return {"schema": PLAN_SCHEMA, "version": PLAN_VERSION,
                **asdict(self), "budget_bytes": bytes_to_json(self.budget_bytes)}

    @staticmethod
    def from_json(data: dict, source: str = "<plan>") -> "Plan":
        """Rebuild a plan from `to_json` output, checking the schema.

        Raises:
            TraceFormatError: naming the source and the bad field.
        """
        if not isinstance(data, dict) or data.get("schema") != PLAN_SCHEMA:
            raise TraceFormatError(f"{source}: field 'schema': not a memplan plan")
        if data.get("version") != PLAN_VERSION:
            raise TraceFormatError(f"{source}: field 'version': expected {PLAN_VERSION}, got {data.get('version')!r}")
        body = {k: v for k, v in data.items() if k not in ("schema", "version")}
        if "device" in body and "profile" not in body:  # written before the field was named for what it holds
            body["profile"] = body.pop("device")
        try:
            _check_types(body, _PLAN_FIELDS, "plan")
            _check_sizes(body)
            if body.get("level", "") not in LEVEL_CHOICES:
                raise ValueError(f"field 'level' must be one of {LEVEL_CHOICES}, not {body['level']!r}")
            body["decisions"] = tuple(Decision(**_check_types(d, _DECISION_FIELDS, "decision"))
                                      for d in body.get("decisions", ()))
            body["pool"] = tuple(PoolSlot(**_check_types(p, _SLOT_FIELDS, "pool slot")) for p in body.get("pool", ()))
            body["microbatches"] = tuple(_microbatch(m) for m in body.get("microbatches", ()))
            body["budget_bytes"] = bytes_from_json(body.get("budget_bytes"))
            return Plan(**body)
        except (TypeError, ValueError, KeyError) as exc:
            raise TraceFormatError(f"{source}: bad plan field: {exc}") from None


_INT = (int,)
_OPT_INT = (int, type(None))
_NUMBER = (int, float)
# JSON types of the fields `from_json` reads (bool is refused where an int is meant).
_PLAN_FIELDS = {"decisions": (list,), "pool": (list,), "pool_bytes": _OPT_INT, "microbatches": (list,),
                "planner": (str,), "params": (dict,), "seed": _OPT_INT, "budget_bytes": _OPT_INT, "profile": (dict,),
                "trace_digest": (str, type(None)), "predicted": (dict,), "planning_s": _NUMBER, "history": (dict,),
                "report": (dict,), "level": (str,)}
_DECISION_FIELDS = {"storage": _INT, "action": (str,), "out_after": _INT, "back_before": _INT,
                    "trigger": _OPT_INT, "sync": (bool,), "overlap": (bool,), "compress_ratio": (int, float, type(None))}
_SLOT_FIELDS = {"storage": _INT, "start": _INT, "offset": _INT}
_MICROBATCH_FIELDS = {"op": _INT, "kernel": (str,), "sizes": (list,), "algos": (list,), "time_s": _NUMBER,
                      "workspace_bytes": _INT, "accumulator_bytes": _INT, "source": (str,), "module": (str,)}


def _microbatch(record) -> MicroBatch:
    m = _check_types(record, _MICROBATCH_FIELDS, "micro-batch")
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in m.get("sizes", [])) \
            or not all(isinstance(a, str) for a in m.get("algos", [])):
        raise TypeError("micro-batch: sizes must be integers and algos strings")
    return MicroBatch(**{**m, "sizes": tuple(m["sizes"]), "algos": tuple(m["algos"])})


def _check_sizes(body: dict) -> None:
    """A budget is at least one byte, a pool and a planning time are not negative; else ValueError."""
    if body.get("budget_bytes") is not None and body["budget_bytes"] < 1:
        raise ValueError(f"field 'budget_bytes' must be at least 1 (or null), not {body['budget_bytes']}")
    if body.get("pool_bytes") is not None and body["pool_bytes"] < 0:
        raise ValueError(f"field 'pool_bytes' must not be negative, not {body['pool_bytes']}")
    if not 0 <= body.get("planning_s", 0) < float("inf"):
        raise ValueError(f"field 'planning_s' must be a finite number of seconds, not {body['planning_s']}")


def _check_types(record, types: dict, what: str) -> dict:
    """`record` if it is an object whose known fields have the JSON types in `types`; else TypeError."""
    if not isinstance(record, dict):
        raise TypeError(f"{what}: expected an object, got {type(record).__name__}")
    for name, value in record.items():
        allowed = types.get(name)
        if allowed is None:
            raise TypeError(f"{what}: unknown field {name!r}")
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise TypeError(f"{what}: field {name!r} has the wrong type ({type(value).__name__})")
    return record
