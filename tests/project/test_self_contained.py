"""A fresh clone needs nothing beside the repository (issue 37).

No file of tests/, benchmarks/, memplan/ or the Makefile may name a path outside the
repository: neither one climbed to from `__file__` (`Path(__file__).parents[2] / ...`, worked
out here from the code), nor one written as text (a relative path up out of the folder, the
development set-up's folders; TEXT_PATTERNS). Data the suite and the benchmarks read is vendored
under `data/` with its licence and source, and no test is skipped because a file is missing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("tests", "benchmarks", "memplan")
CODE_SUFFIXES = (".py", ".c", ".h", ".sh")
UP = ".."  # a path part above the repository root
# Written in pieces, so that this file does not name what it looks for.
TEXT_PATTERNS = {
    "a relative path that climbs out": re.compile(re.escape(UP + "/")),
    "the development set-up's folder": re.compile(re.escape("/" + "work/")),
    "the development set-up's data": re.compile(re.escape("shared" + "/data")),
    "a test skipped when a file is missing": re.compile(r"skipif\(\s*not\s[^)]*\.exists\(\)"),
}
# Data the suite reads, vendored: each folder with its licence and where it comes from.
VENDORED = {"minimalloc-challenging": 12, "deepbench": 2}  # folder -> CSV files


def scanned_files() -> list[Path]:
    files = [p for top in SCANNED for p in (ROOT / top).rglob("*")
             if p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts and p.is_file()]
    return sorted(files) + [ROOT / "Makefile"]


# --- paths worked out from __file__ -------------------------------------------------------------------


def _up(parts: tuple[str, ...] | None, levels: int) -> tuple[str, ...] | None:
    for _ in range(levels):
        if parts is None:
            return None
        parts = parts[:-1] if parts and parts[-1] != UP else parts + (UP,)
    return parts


def _join(parts: tuple[str, ...] | None, text: str) -> tuple[str, ...] | None:
    for piece in text.split("/"):
        if piece == UP:
            parts = _up(parts, 1)
        elif piece not in ("", ".") and parts is not None:
            parts = parts + (piece,)
    return parts


def _call_name(func: ast.expr) -> str:
    return ast.unparse(func).rsplit(".", 1)[-1]


def resolve(node: ast.expr, here: tuple[str, ...], names: dict) -> tuple[str, ...] | None:
    """The repository-relative parts of the path `node` builds from `__file__` (a leading ".."
    is above the repository), or None when it is not such a path."""
    def sub(n):
        return resolve(n, here, names)

    if isinstance(node, ast.Name):
        return here if node.id == "__file__" else names.get(node.id)
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        return _up(sub(node.value), 1)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents" \
            and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
        return _up(sub(node.value.value), node.slice.value + 1)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant):
        return _join(sub(node.left), str(node.right.value))
    if isinstance(node, ast.Call):
        name = _call_name(node.func)
        if name in ("resolve", "absolute") and isinstance(node.func, ast.Attribute):
            return sub(node.func.value)
        if name in ("Path", "PurePath", "abspath", "realpath", "fspath", "str") and len(node.args) == 1:
            return sub(node.args[0])
        if name == "dirname" and len(node.args) == 1:
            return _up(sub(node.args[0]), 1)
        if name in ("join", "joinpath") and node.args:
            base, rest = (sub(node.func.value), node.args) if name == "joinpath" else (sub(node.args[0]), node.args[1:])
            for arg in rest:
                base = _join(base, str(arg.value)) if isinstance(arg, ast.Constant) else None
            return base
    return None


def climbs_out(source: str, relpath: str) -> list[int]:
    """Lines of `source` (a Python file at repository path `relpath`) whose path from
    `__file__` leads above the repository root."""
    here = PurePosixPath(relpath).parts
    tree = ast.parse(source)
    names: dict[str, tuple[str, ...] | None] = {}
    for node in sorted((n for n in ast.walk(tree) if isinstance(n, ast.Assign)), key=lambda n: n.lineno):
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            names[node.targets[0].id] = resolve(node.value, here, names)
    return sorted({node.lineno for node in ast.walk(tree) if isinstance(node, ast.expr)
                   and (parts := resolve(node, here, names)) is not None and parts[:1] == (UP,)})


def outside_paths(source: str, relpath: str) -> list[str]:
    """Every place in a file that names a path outside the repository, as `path:line: why`."""
    found = [f"{relpath}:{line}: a path from __file__ above the repository"
             for line in (climbs_out(source, relpath) if relpath.endswith(".py") else [])]
    for number, line in enumerate(source.splitlines(), 1):
        found += [f"{relpath}:{number}: {why}" for why, pattern in TEXT_PATTERNS.items() if pattern.search(line)]
    return found


# --- the checks --------------------------------------------------------------------------------------------


def test_nothing_reads_outside_the_repository():
    files = scanned_files()
    assert len(files) > 200 and ROOT / "tests" / "pool" / "test_search.py" in files  # the scan found the code
    found = [hit for path in files for hit in outside_paths(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert not found


@pytest.mark.parametrize("relpath, name", [("tests/pool/test_search.py", "CHALLENGING"),
                                           ("tests/pool/test_api.py", "CHALLENGING"),
                                           ("tests/tracing/test_importers_minimalloc.py", "CHALLENGING"),
                                           ("benchmarks/pool.py", "DATA"), ("benchmarks/pool_preorders.py", "DATA"),
                                           ("benchmarks/ucudnn.py", "DEEPBENCH")])
def test_the_readers_of_the_data_are_understood_and_read_the_vendored_copy(relpath, name):
    """The scan works out these files' data paths (so it is not blind to them), and each is in data/."""
    tree = ast.parse((ROOT / relpath).read_text())
    names: dict = {}
    for node in (n for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)):
        names[node.targets[0].id] = resolve(node.value, PurePosixPath(relpath).parts, names)
    assert names[name] is not None and names[name][0] == "data"
    assert (ROOT.joinpath(*names[name])).is_dir()


@pytest.mark.parametrize("relpath, line", [
    ("tests/t.py", 'D = Path(__file__).resolve().parents[2] / "data"'),
    ("tests/t.py", 'D = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data")'),
    ("benchmarks/b.py", 'ROOT = Path(__file__).resolve().parent.parent\nD = ROOT.parent / "elsewhere"'),
    ("memplan/pool/m.py", 'D = Path(__file__).parents[1] / "' + "/".join([UP] * 3) + '/x"'),
    ("tests/t.py", "D = '" + UP + "/" + "shared" + "/data'"),
    ("tests/t.py", "D = Path('/" + "work/" + "shared')"),
    ("tests/t.py", "@pytest.mark.skip" + "if(not DATA.exists(), reason='no data')\ndef test_x():\n    pass"),
])
def test_the_scan_catches_a_path_outside(relpath, line):
    assert outside_paths(line + "\n", relpath)


@pytest.mark.parametrize("relpath, line", [
    ("tests/t.py", 'D = Path(__file__).resolve().parents[1] / "data" / "deepbench"'),
    ("benchmarks/b.py", 'ROOT = Path(__file__).resolve().parent.parent\nD = ROOT / "data"'),
    ("memplan/pool/m.py", 'D = Path(__file__).parents[1] / "pool" / ".." / "conv"'),
    ("tests/t.py", 'D = Path(__file__).with_name("x.json")'),
])
def test_the_scan_passes_a_path_inside(relpath, line):
    assert outside_paths(line + "\n", relpath) == []


@pytest.mark.parametrize("folder, csv_files", sorted(VENDORED.items()))
def test_vendored_data_keeps_its_licence_and_source(folder, csv_files):
    where = ROOT / "data" / folder
    assert "Apache License" in (where / "LICENSE").read_text()
    assert "github.com/" in (where / "SOURCE.md").read_text()
    assert len(list(where.glob("*.csv"))) == csv_files
