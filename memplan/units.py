"""Byte sizes and budgets as people write them ("8GiB", "1.5GB", "60%")."""

from __future__ import annotations

import math
import numbers
import re

from .errors import MemplanError

_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
    "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
}
# Sizes above this are typos (and overflow the simulator's int64 arithmetic).
MAX_BYTES = 2**60
ANY_PEAK = 2**40  # the peak a share is checked against before the real one is known
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


class ByteSize(int):
    """A byte count given as "64MiB", "1e9" or an int: the type of planner parameters that are sizes."""


def parse_bytes(text: str | int) -> int:
    """Parse "8GiB", "512MB", "1e9" or an int into a byte count.

    Raises:
        MemplanError: the text is not a size, or not a plausible one (above 1 EiB).
    """
    if isinstance(text, bool):
        raise MemplanError(f"not a byte size: {text!r}")
    if isinstance(text, numbers.Integral):
        return _plausible(int(text), text)
    match = _SIZE.match(str(text))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise MemplanError(f"not a byte size: {text!r} (examples: 8GiB, 512MB, 1000000)")
    value = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(value):
        raise MemplanError(f"not a byte size: {text!r} (examples: 8GiB, 512MB, 1000000)")
    return _plausible(int(round(value)), text)


def parse_budget(text: str | int | float, peak_bytes: int) -> int:
    """Parse a budget: bytes ("8GiB", an int) or a share of the unconstrained peak.

    A share is a string ending in "%" ("60%"; above 100% is a cap above the peak, e.g.
    room for a pool's fragmentation) or a float in (0, 1] (0.6 means 60%).

    Args:
        text: the budget as given by the user.
        peak_bytes: the unconstrained peak load that a share refers to.
    Returns:
        The budget in bytes, at least 1.
    Raises:
        MemplanError: not a budget, not positive, not finite, or rounding to 0 bytes.
    """
    if isinstance(text, numbers.Real) and not isinstance(text, (bool, numbers.Integral)):
        share = float(text)
        if not 0.0 < share <= 1.0:
            raise MemplanError(f"a float budget is a share of the peak in (0, 1] (0.7 means 70%), not {text!r}; "
                               f"give bytes as an int or a string (8GiB, 512MB, 150%)")
        return _share(share, peak_bytes, text)
    if isinstance(text, str) and text.strip().endswith("%"):
        try:
            share = float(text.strip()[:-1]) / 100.0
        except ValueError:
            raise MemplanError(f"not a budget: {text!r} (examples: 8GiB, 60%)") from None
        return _share(share, peak_bytes, text)
    value = parse_bytes(text)
    if value <= 0:
        raise MemplanError(f"budget {text!r} is {value} bytes; give bytes (8GiB, 512MB, 1000000) or a share of the "
                           f"peak with % ({_as_percent(text)})")
    return value


def _as_percent(text) -> str:
    """A percentage example: what `text` meant if it was a fraction ("0.5" -> "50%"), else 60%."""
    try:
        share = float(text)
    except (TypeError, ValueError):
        return "e.g. 60%"
    return f"{share * 100:g}% for {text}?" if 0 < share < 1 else "e.g. 60%"


def check_budget(text: str | int | float) -> None:
    """Refuse, before any trace exists, what is a budget for no peak ("abc", "-5%", "0").

    Raises:
        MemplanError: as `parse_budget` would.
    """
    parse_budget(text, ANY_PEAK)


def _share(share: float, peak_bytes: int, text) -> int:
    if not math.isfinite(share) or share <= 0:
        raise MemplanError(f"budget must be a positive share of the peak: {text!r}")
    value = int(peak_bytes * share)
    if value < 1:
        raise MemplanError(f"budget {text!r} of a {peak_bytes}-byte peak is less than one byte")
    return _plausible(value, text)


def _plausible(value: int, text) -> int:
    if value > MAX_BYTES:
        raise MemplanError(f"not a plausible size: {text!r} is more than {format_bytes(MAX_BYTES)}")
    return value


def format_bytes(n: int | float) -> str:
    """Render a byte count with a binary unit, e.g. 1.50 GiB."""
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"
