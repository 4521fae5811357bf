"""Byte sizes as people write them ("8GiB", "1.5GB", "1e9"); budgets are memplan.budget."""

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
        return plausible_bytes(int(text), text)
    match = _SIZE.match(str(text))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise MemplanError(f"not a byte size: {text!r} (examples: 8GiB, 512MB, 1000000)")
    value = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(value):
        raise MemplanError(f"not a byte size: {text!r} (examples: 8GiB, 512MB, 1000000)")
    return plausible_bytes(int(round(value)), text)


def plausible_bytes(value: int, text) -> int:
    """`value`, refused when it is above MAX_BYTES (a typo, and beyond the simulator's int64 arithmetic)."""
    if value > MAX_BYTES:
        raise MemplanError(f"not a plausible size: {text!r} is more than {format_bytes(MAX_BYTES)}")
    return value


def format_bytes(n: int | float) -> str:
    """Render a byte count with a binary unit, e.g. 1.50 GiB."""
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"
