"""Byte sizes and budgets as people write them ("8GiB", "1.5GB", "60%")."""

from __future__ import annotations

import re

from .errors import MemplanError

_UNITS = {
    "": 1, "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
    "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str | int) -> int:
    """Parse "8GiB", "512MB", "1e9" or an int into a byte count.

    Raises:
        MemplanError: the text is not a size.
    """
    if isinstance(text, int):
        return text
    match = _SIZE.match(str(text))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise MemplanError(f"not a byte size: {text!r} (examples: 8GiB, 512MB, 1000000)")
    return int(round(float(match.group(1)) * _UNITS[unit]))


def parse_budget(text: str | int | float, peak_bytes: int) -> int:
    """Parse a budget: bytes ("8GiB") or a share of the unconstrained peak ("60%").

    Args:
        text: the budget as given by the user; an int is bytes.
        peak_bytes: the unconstrained peak load that a percentage refers to.
    Returns:
        The budget in bytes.
    """
    if isinstance(text, str) and text.strip().endswith("%"):
        try:
            share = float(text.strip()[:-1]) / 100.0
        except ValueError:
            raise MemplanError(f"not a budget: {text!r} (examples: 8GiB, 60%)") from None
        if share <= 0:
            raise MemplanError(f"budget must be positive: {text!r}")
        return int(peak_bytes * share)
    if isinstance(text, float):
        return int(text)
    value = parse_bytes(text)
    if value <= 0:
        raise MemplanError(f"budget must be positive: {text!r}")
    return value


def format_bytes(n: int | float) -> str:
    """Render a byte count with a binary unit, e.g. 1.50 GiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"
