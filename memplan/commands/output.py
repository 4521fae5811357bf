"""How commands print: two-column rows, tables, human units, one JSON object."""

from __future__ import annotations

import json
import shutil
import textwrap

from ..units import format_bytes

TEXT_COLUMNS = 100  # width of text output when stdout is not a terminal
MIN_VALUE_COLUMNS = 40  # a table's value column is never narrower than this


def print_rows(rows) -> None:
    """Print (name, value) rows as two columns, the first as wide as its longest name and a
    long value wrapped under its column to the terminal's width."""
    width = max((len(str(name)) for name, _ in rows), default=0)
    room = max(shutil.get_terminal_size((TEXT_COLUMNS, 0)).columns - width - 2, MIN_VALUE_COLUMNS)
    for name, value in rows:
        lines = textwrap.wrap(str(value), room, break_long_words=False, break_on_hyphens=False) or [""]
        print(f"{name:<{width}}  {lines[0]}")
        for line in lines[1:]:
            print(f"{'':<{width}}  {line}")


def print_table(header: tuple[str, ...], rows: list[tuple], left: int = 1) -> None:
    """Print a table whose columns are as wide as their widest cell: the first `left` columns
    aligned left (names), the others right (numbers)."""
    cells = [tuple(map(str, header))] + [tuple(map(str, row)) for row in rows]
    widths = [max(len(row[i]) for row in cells if i < len(row)) for i in range(len(header))]
    for row in cells:
        print("  ".join(cell.ljust(w) if i < left else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(row, widths))).rstrip())


def readable(key: str, value) -> tuple[str, str]:
    """A JSON field as a table row: its name in words, its value in human units (`*_bytes` in
    KiB/MiB/GiB, `*_s` in seconds, overheads and gaps in percent, none as "-")."""
    name = key.replace("_", " ")
    if value is None:
        text = "-"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif key.endswith("_bytes") and isinstance(value, int):
        name, text = name.removesuffix(" bytes"), format_bytes(value)
    elif key.endswith("_s") and isinstance(value, (int, float)):
        name, text = name.removesuffix(" s"), f"{value:.3g} s"
    elif key.endswith(("overhead", "gap")) and isinstance(value, (int, float)):
        text = f"{value:.2%}"
    elif isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = str(value)
    return name, text


def count(n: int, noun: str) -> str:
    """`n` and the noun, plural unless n is 1: "1 kernel", "3 kernels"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def emit_json(obj: dict) -> None:
    """Print one JSON object on stdout (numpy scalars and other odd types as plain values)."""
    print(json.dumps(obj, default=_plain))


def _plain(value):
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
