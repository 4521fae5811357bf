"""The code's shape (issue 28): small modules, short functions, no import loops.

The simulator's numba kernel is the one exception to the sizes: one loop that numba compiles whole.
"""

import ast
from pathlib import Path

import grimp
import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent.parent / "memplan"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
KERNEL = ("sim/_kernel.py", "run_kernel")


def _modules():
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def test_no_module_over_the_limit():
    long = {_name(p): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long


def test_no_function_over_the_limit():
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES and (_name(path), node.name) != KERNEL:
                    long.append(f"{_name(path)}:{node.name} ({lines} lines)")
    assert not long


def test_the_kernel_exception_still_exists():
    """The exception names a real function: once the kernel is split, it goes."""
    tree = ast.parse((PACKAGE / KERNEL[0]).read_text())
    assert KERNEL[1] in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_no_import_loop():
    graph = grimp.build_graph("memplan", exclude_type_checking_imports=True)
    edges = nx.DiGraph((m, n) for m in graph.modules for n in graph.find_modules_directly_imported_by(m))
    loops = [sorted(c) for c in nx.strongly_connected_components(edges) if len(c) > 1]
    assert not loops


MAX_PARAMETERS = 8
PARAMETER_LIMITED = ("workflows", "commands")  # the compositions: their options travel as values (RunOptions, Problem)


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The parameters a caller can name: positional and keyword ones, `self` and `cls` left out. `*args` (a
    step's own inputs) and `**kwargs` (options by name, parsed by one function: RunOptions.of, a planner's
    check) are not counted."""
    a = node.args
    return sum(p.arg not in ("self", "cls") for p in a.posonlyargs + a.args + a.kwonlyargs)


def test_no_composition_takes_more_than_eight_parameters():
    wide = []
    for folder in PARAMETER_LIMITED:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _parameters(node) > MAX_PARAMETERS:
                    wide.append(f"{_name(path)}:{node.name} ({_parameters(node)} parameters)")
    assert not wide
