"""What the independent validator reports: one `Violation` per rule a plan breaks, by kind.

Apart from memplan.sim.validate so that its rule modules share them; like the validator,
this shares no code with the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

UNKNOWN_STORAGE = "unknown_storage"
OUT_OF_LIFETIME = "out_of_lifetime"
BAD_WRAP = "bad_wrap"
WRONG_TRACE = "wrong_trace"
READ_WHILE_ABSENT = "read_while_absent"
BAD_TRIGGER = "bad_trigger"
OVERLAPPING_GAPS = "overlapping_gaps"
NOT_RECOMPUTABLE = "not_recomputable"
RECOMPUTE_INPUT_ABSENT = "recompute_input_absent"
RECOMPUTE_INPUT_OVERWRITTEN = "recompute_input_overwritten"
POOL_MISSING_SLOT = "pool_missing_slot"
POOL_STRAY_SLOT = "pool_stray_slot"
POOL_OVERLAP = "pool_overlap"
POOL_OUT_OF_RANGE = "pool_out_of_range"
OVER_BUDGET = "over_budget"
POOL_OVER_BUDGET = "pool_over_budget"
BAD_CONV_DECISION = "bad_conv_decision"
OVERLAP_WRITES = "overlap_writes"
ENGINE_OWNED = "engine_owned"

KINDS = (UNKNOWN_STORAGE, OUT_OF_LIFETIME, BAD_WRAP, WRONG_TRACE, READ_WHILE_ABSENT, BAD_TRIGGER,
         OVERLAPPING_GAPS, NOT_RECOMPUTABLE, RECOMPUTE_INPUT_ABSENT, RECOMPUTE_INPUT_OVERWRITTEN, POOL_MISSING_SLOT,
         POOL_STRAY_SLOT, POOL_OVERLAP, POOL_OUT_OF_RANGE, OVER_BUDGET, POOL_OVER_BUDGET, BAD_CONV_DECISION,
         OVERLAP_WRITES, ENGINE_OWNED)


@dataclass(frozen=True, kw_only=True)
class Violation:
    """One rule a plan breaks."""

    kind: str  # one of KINDS
    storage: int | None  # the storage concerned, where there is one
    op: int | None  # the op where it happens, where there is one
    message: str  # one readable line

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"
