"""Helpers for tests of user mistakes: exit code 2, exactly one line on stderr, no traceback."""

from __future__ import annotations

import os
from pathlib import Path

from memplan.cli import USAGE_ERROR, main

PREFIX = "memplan: error: "


def one_line_error(capsys, argv: list[str]) -> str:
    """Run the CLI on `argv`, assert it refused in one line with exit code 2, return that line."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert rc == USAGE_ERROR, f"rc {rc} for {argv}: {err or out}"
    assert len(lines) == 1 and lines[0].startswith(PREFIX), f"{argv}: stderr {err!r}"
    assert "Traceback" not in err
    return lines[0][len(PREFIX):]


def files_under(folder: str | os.PathLike) -> set[str]:
    """Every file below `folder` (relative names), hidden temporaries included."""
    root = Path(folder)
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
