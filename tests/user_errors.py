"""Helpers for tests of user mistakes: exit code 2, exactly one line on stderr, no traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from memplan.cli import USAGE_ERROR, main
from memplan.testing.synthetic import chain_trace
from memplan.tracing.io import write_trace

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


def json_run(capsys, argv) -> tuple[int, dict]:
    """Run the CLI on `argv` (with --json among them); its exit code and the JSON it printed."""
    rc = main([str(a) for a in argv])
    return rc, json.loads(capsys.readouterr().out)


@pytest.fixture
def trace_file(tmp_path):
    """A small chain trace written as JSON lines (a test imports this fixture by name)."""
    path = tmp_path / "t.jsonl"
    write_trace(chain_trace(6), path)
    return path
