"""Issue 28: every planning rule that several planners apply is defined once, in memplan/planners/kit.

A planner module that writes one of them again fails here: by name (the kit's `RULES`, and the
names of the copies the kit replaced), and, where a rule has a recognisable shape, by shape
(an input overwritten before a replay, a bisection for the smallest budget that fits, the
saved-activation test, a storage alive at an op, an op's aten name, unconstrained op start
times, the convolution op names, the order decisions are listed in). The kit imports no
planner family, and helper modules live inside their family's package: memplan/planners
holds `base`, `kit` and planner families only.
"""

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import memplan.planners as planners
from memplan.planners.base import known_planners
from memplan.planners.kit import RULES

PLANNERS_DIR = Path(planners.__file__).parent
KIT_DIR = PLANNERS_DIR / "kit"
# The copies the kit replaced (issue 28), which must not come back under their old names.
FORMER_NAMES = {
    "overwritten_input", "_overwritten",  # input_overwritten
    "smallest_budget", "smallest_cap",  # smallest_fitting_budget
    "_spans", "absent_mask",  # gap_covers, away_mask
    "reduced_load",  # load_without
    "prefetch_trigger",  # lead_trigger
    "_is_conv",  # is_convolution
    "_backward_activations", "_first_backward_access", "_last_access_before",  # saved_activations and its helpers
    "_seed_plans",  # fitting_plans
}
NOT_FAMILIES = {"base", "kit", "bound"}


def _modules(outside_kit: bool):
    for path in sorted(PLANNERS_DIR.rglob("*.py")):
        if (KIT_DIR in path.parents) != outside_kit:
            yield path, ast.parse(path.read_text(), filename=str(path))


def _defined_names(tree: ast.Module) -> set[str]:
    """Functions and classes at any depth, and names assigned at module level."""
    names = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _functions(tree: ast.Module):
    return [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]


def _where(path: Path, node) -> str:
    return f"{path.relative_to(PLANNERS_DIR.parent.parent)}:{node.lineno} {getattr(node, 'name', '')}"


def test_every_rule_is_defined_in_the_kit_module_it_names():
    for name, module in RULES.items():
        kit_module = importlib.import_module(f"memplan.planners.kit.{module}")
        assert name in _defined_names(ast.parse(Path(kit_module.__file__).read_text())), (name, module)


def test_no_module_outside_the_kit_defines_a_rule_again_by_name():
    again = [f"{path.name}: {name}" for path, tree in _modules(outside_kit=True)
             for name in _defined_names(tree) & (set(RULES) | FORMER_NAMES)]
    assert again == [], f"defined again outside memplan/planners/kit (use the kit's): {again}"


def test_each_rule_is_defined_once_inside_the_kit():
    counts: dict[str, list[str]] = {}
    for path, tree in _modules(outside_kit=False):
        for name in _defined_names(tree) & set(RULES):
            counts.setdefault(name, []).append(path.name)
    assert {name: where for name, where in counts.items() if len(where) > 1} == {}


# --- by shape --------------------------------------------------------------------------------------


def _calls(node, attribute: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == attribute
               for n in ast.walk(node))


def _subscripts(node, attribute: str) -> bool:
    return any(isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute) and n.value.attr == attribute
               for n in ast.walk(node))


def _reads(node, attribute: str) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == attribute for n in ast.walk(node))


def _compares(node, attribute: str, value: str) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Compare) and isinstance(n.left, ast.Attribute) and n.left.attr == attribute:
            if any(isinstance(c, ast.Constant) and c.value == value for c in n.comparators):
                return True
    return False


def _lifetime_covers(node) -> bool:
    """`s.alloc_op <= op < s.free_op`."""
    return any(isinstance(n, ast.Compare) and isinstance(n.left, ast.Attribute) and n.left.attr == "alloc_op"
               and any(isinstance(c, ast.Attribute) and c.attr == "free_op" for c in n.comparators)
               for n in ast.walk(node))


def _bisects(node) -> bool:
    """`(lo + hi) // 2` somewhere in `node`."""
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.FloorDiv) and isinstance(n.left, ast.BinOp)
               and isinstance(n.left.op, ast.Add) for n in ast.walk(node))


def _strips_aten(node) -> bool:
    """The namespace prefix of traced op names, as a literal."""
    return any(isinstance(n, ast.Constant) and n.value == "aten." for n in ast.walk(node))


def _cumsum_of_durations(node) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "cumsum"
               and n.args and isinstance(n.args[0], ast.Attribute) and n.args[0].attr == "durations"
               for n in ast.walk(node))


def _issue_order_key(node) -> bool:
    """`(x.back_before, x.storage)`."""
    return any(isinstance(n, ast.Tuple) and [getattr(e, "attr", None) for e in n.elts] == ["back_before", "storage"]
               for n in ast.walk(node))


def _conv_op_names(node) -> bool:
    return any(isinstance(n, ast.Set) and any(isinstance(e, ast.Constant) and e.value == "convolution"
                                              for e in n.elts) for n in ast.walk(node))


SHAPES = {
    "an input overwritten before a replay (kit.replayable.input_overwritten)":
        lambda f: _calls(f, "lineage") and _subscripts(f, "writers"),
    "a bisection for the smallest budget that fits (kit.fitting.smallest_fitting_budget)":
        lambda f: _bisects(f) and _reads(f, "feasible"),
    "which activations autograd saved (kit.saved.saved_activations)":
        lambda f: _compares(f, "kind", "activation") and _compares(f, "phase", "backward"),
    "whether the trace holds a storage at an op (kit.gaps.alive_at)": _lifetime_covers,
}
MODULE_SHAPES = {
    "an op's aten name (kit.ops.aten_name)": _strips_aten,
    "unconstrained op start times (kit.ops.op_starts)": _cumsum_of_durations,
    "the convolution op names (kit.ops.CONV_OPS)": _conv_op_names,
    "the order decisions are listed in (kit.prefetch.in_issue_order)": _issue_order_key,
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_no_function_outside_the_kit_has_the_shape_of_a_rule(shape):
    found = [_where(path, f) for path, tree in _modules(outside_kit=True) for f in _functions(tree) if SHAPES[shape](f)]
    assert found == [], f"{shape}, written again: {found}"


@pytest.mark.parametrize("shape", sorted(MODULE_SHAPES))
def test_no_module_outside_the_kit_has_the_shape_of_a_rule(shape):
    found = [str(path.relative_to(PLANNERS_DIR)) for path, tree in _modules(outside_kit=True)
             if MODULE_SHAPES[shape](tree)]
    assert found == [], f"{shape}, written again: {found}"


def test_the_shapes_find_the_kit_rules_they_stand_for():
    # The checks above are only as good as their shapes: each one finds the kit's own definition.
    kit = {path.stem: tree for path, tree in _modules(outside_kit=False)}
    functions = {f.name: f for tree in kit.values() for f in _functions(tree)}
    assert SHAPES["an input overwritten before a replay (kit.replayable.input_overwritten)"](functions["input_overwritten"])
    assert SHAPES["a bisection for the smallest budget that fits (kit.fitting.smallest_fitting_budget)"](
        functions["smallest_fitting_budget"])
    saved = "which activations autograd saved (kit.saved.saved_activations)"
    assert SHAPES[saved](ast.Module(body=[functions["saved_activations"], functions["first_backward_access"]],
                                    type_ignores=[]))
    assert SHAPES["whether the trace holds a storage at an op (kit.gaps.alive_at)"](functions["alive_at"])
    assert all(MODULE_SHAPES[shape](kit["ops"]) for shape in MODULE_SHAPES if "kit.ops" in shape)
    assert _issue_order_key(kit["prefetch"])


# --- layout ----------------------------------------------------------------------------------------


def _relative_imports(tree: ast.Module, package: str) -> set[str]:
    """Absolute names of what `tree` (a module of `package`) imports relatively or from memplan."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                out.add(f"{base}.{node.module}" if node.module else base)
            elif node.module and node.module.startswith("memplan"):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("memplan")}
    return out


def test_the_kit_imports_no_planner_family():
    allowed = ("memplan.planners.kit", "memplan.planners.base")
    for path, tree in _modules(outside_kit=False):
        wrong = [name for name in _relative_imports(tree, "memplan.planners.kit")
                 if name.startswith("memplan.planners") and not name.startswith(allowed)]
        assert wrong == [], f"{path.name} imports a planner family: {wrong}"


def test_memplan_planners_holds_base_the_kit_the_bound_and_families_only():
    registered_by = {spec.fn.__module__.split(".")[2] for spec in known_planners().values()}
    for info in pkgutil.iter_modules(planners.__path__):
        where = f"memplan/planners/{info.name}"
        assert not info.name.startswith("_"), f"{where}: a helper belongs in its family's package"
        assert info.name in NOT_FAMILIES or info.name in registered_by, f"{where} registers no planner"
