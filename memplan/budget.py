"""A memory budget, parsed once where a user gives it.

A `Budget` is one of three things: a cap in bytes ("8GiB", 1000000), a share of the trace's
unconstrained peak ("60%", or a float in (0, 1]: 0.6), or no cap ("none", `UNLIMITED`).
`parse_budget` turns what a user writes into one, at the edge (a CLI option, the `budget=`
argument of the Python API); `Budget.bytes_for(peak)` resolves it against a trace once the
trace is known. Everything below the edge sees integer bytes only.

"No limit" is spelled once: `UNLIMITED` as a Budget, `NO_LIMIT` as bytes (a cap no trace
reaches, so that every comparison with a load needs no special case), written as `null` in
a plan file (`bytes_to_json`, `bytes_from_json`). Nothing else stands for "no limit".

Where a plan meets a budget (simulating it, validating it, compiling its step program),
`budget_in_force` is the one rule: the budget given, else the plan's own.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from .errors import MemplanError
from .units import MAX_BYTES, format_bytes, parse_bytes, plausible_bytes
from .vocabulary import Vocabulary

NO_CAP = "none"  # the budget written as text that asks for no cap
ANY_PEAK = 2**40  # the peak a share is checked against before the real one is known
NO_LIMIT = MAX_BYTES  # "no limit" in bytes: above any plausible size, within the simulator's int64 arithmetic


class BudgetSource(Vocabulary):
    """Where the cap a plan was simulated or checked under came from."""

    GIVEN = "given"  # by the caller
    PLAN = "plan"  # the plan's own budget
    NONE = "none"  # no cap


@dataclass(frozen=True, kw_only=True)
class Budget:
    """A memory budget: a cap in bytes, a share of the unconstrained peak, or no cap (neither set)."""

    nbytes: int | None = None  # the cap in bytes
    share: float | None = None  # the cap as a share of the trace's unconstrained peak (0.6 is 60%)
    text: str = field(default=NO_CAP, compare=False)  # as the user wrote it (messages, labels)

    @classmethod
    def of_bytes(cls, nbytes: int) -> Budget:
        """A cap of `nbytes` bytes (code that already holds bytes: a margin, a memory cap)."""
        return cls(nbytes=int(nbytes), text=str(int(nbytes)))

    @property
    def unlimited(self) -> bool:
        """True for no cap."""
        return self.nbytes is None and self.share is None

    def bytes_for(self, peak_bytes: int) -> int:
        """The cap in bytes for a trace whose unconstrained peak is `peak_bytes` (NO_LIMIT: no cap).

        Raises:
            MemplanError: a share of that peak is less than one byte.
        """
        if self.share is not None:
            return _share_bytes(self.share, peak_bytes, self.text)
        return NO_LIMIT if self.nbytes is None else self.nbytes

    def __str__(self) -> str:
        return self.text


UNLIMITED = Budget()


def parse_budget(value: Budget | str | int | float | None) -> Budget:
    """A budget from what a user writes: bytes ("8GiB", an int), a share of the unconstrained
    peak (a string ending in "%", "60%"; above 100% is a cap above the peak, e.g. room for a
    pool's fragmentation; or a float in (0, 1]: 0.6 means 60%), or "none" (or None) for no cap.

    Raises:
        MemplanError: not a budget, not positive, not finite, or rounding to 0 bytes.
    """
    if isinstance(value, Budget):
        return value
    if value is None:
        return UNLIMITED
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, numbers.Integral)):
        if not 0.0 < float(value) <= 1.0:
            raise MemplanError(f"a float budget is a share of the peak in (0, 1] (0.7 means 70%), not {value!r}; "
                               f"give bytes as an int or a string (8GiB, 512MB, 150%)")
        return _checked_share(float(value), value)
    if isinstance(value, str) and value.strip().lower() == NO_CAP:
        return UNLIMITED
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            share = float(value.strip()[:-1]) / 100.0
        except ValueError:
            raise MemplanError(f"not a budget: {value!r} (examples: 8GiB, 60%)") from None
        return _checked_share(share, value)
    nbytes = parse_bytes(value)
    if nbytes <= 0:
        raise MemplanError(f"budget {value!r} is {nbytes} bytes; give bytes (8GiB, 512MB, 1000000) or a share of the "
                           f"peak with % ({_as_percent(value)})")
    return Budget(nbytes=nbytes, text=str(value))


def parse_budgets(text: str) -> list[Budget]:
    """Budgets from a comma-separated list of caps ("100%,80%,8GiB"), for a sweep over them.

    Raises:
        MemplanError: an empty list, an item that is not a budget, or "none" (no cap is not a
            point of a sweep).
    """
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    if not items:
        raise MemplanError(f"no budgets in {text!r} (example: 100%,90%,80%)")
    budgets = [parse_budget(item) for item in items]
    if any(b.unlimited for b in budgets):
        raise MemplanError(f"budgets {text!r}: each is a cap (bytes or a share of the peak), not {NO_CAP!r}")
    return budgets


def budget_given(value: Budget | str | int | float | None) -> Budget | None:
    """`parse_budget(value)`, or None when no budget is given (then the plan's own applies)."""
    return None if value is None else parse_budget(value)


def budget_in_force(given: Budget | None, plan_budget_bytes: int, peak_bytes: int) -> tuple[int, BudgetSource]:
    """The cap a plan is simulated or checked under, and where it came from: the budget given,
    else the plan's own budget (`Plan.budget_bytes`), else none (NO_LIMIT).

    Args:
        given: the budget the caller gave (None: not given).
        plan_budget_bytes: the budget the plan was made under (NO_LIMIT: made without one).
        peak_bytes: the trace's unconstrained peak, which a share refers to.
    """
    if given is not None:
        return given.bytes_for(peak_bytes), BudgetSource.NONE if given.unlimited else BudgetSource.GIVEN
    if limited(plan_budget_bytes):
        return int(plan_budget_bytes), BudgetSource.PLAN
    return NO_LIMIT, BudgetSource.NONE


def limited(nbytes: int) -> bool:
    """Whether a cap of `nbytes` bytes is a limit (not NO_LIMIT)."""
    return nbytes < NO_LIMIT


def bytes_label(nbytes: int) -> str:
    """A cap for people: "8.00 GiB", or "none" for NO_LIMIT."""
    return format_bytes(nbytes) if limited(nbytes) else NO_CAP


def bytes_to_json(nbytes: int) -> int | None:
    """A cap as a plan file writes it: its bytes, or null for NO_LIMIT."""
    return int(nbytes) if limited(nbytes) else None


def bytes_from_json(value: int | None) -> int:
    """A cap as a plan file holds it (null: no limit) in bytes."""
    return NO_LIMIT if value is None else int(value)


def _checked_share(share: float, value) -> Budget:
    """A share budget, refused now when it is a budget for no peak ("0%", "-5%", "nan%")."""
    _share_bytes(share, ANY_PEAK, value)
    return Budget(share=share, text=str(value))


def _share_bytes(share: float, peak_bytes: int, text) -> int:
    if not math.isfinite(share) or share <= 0:
        raise MemplanError(f"budget must be a positive share of the peak: {text!r}")
    value = int(peak_bytes * share)
    if value < 1:
        raise MemplanError(f"budget {text!r} of a {peak_bytes}-byte peak is less than one byte")
    return plausible_bytes(value, text)


def _as_percent(text) -> str:
    """A percentage example: what `text` meant if it was a fraction ("0.5" -> "50%"), else 60%."""
    try:
        share = float(text)
    except (TypeError, ValueError):
        return "e.g. 60%"
    return f"{share * 100:g}% for {text}?" if 0 < share < 1 else "e.g. 60%"

