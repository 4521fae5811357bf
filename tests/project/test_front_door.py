"""One front door (issue 38), narrowed (issue 50): `memplan` is the library's public module for users,
`memplan.services` the rest of what its command line uses, and the benchmarks reach the library
through those two as the command line does.

Every `import memplan...` / `from memplan... import` of every benchmarks/*.py (read with `ast`,
nothing run) names `memplan`, `memplan.services` or a foundation module (errors, units, fileio,
budget, problem, run_options, vocabulary, progress, plots, registry). A benchmark that times one internal component
(the simulator's kernel, the pool search, DQN's environment...) may import that component's
module, as tests may: each such (benchmark, module) pair is listed in COMPONENT_BENCHMARKS with
why. The list must stay exact: a new internal import fails until it is listed (or goes through
the front door, once memplan exports what it needs), and an entry no longer imported fails as
stale. A name the doors export comes through them even where its module is listed.

Also: every name in `memplan.__all__` (and `memplan.services.__all__`) resolves, the two doors
share no name, every name of the front door is on a page of the documentation, and
`import memplan` stays cheap (no numpy, no torch: its names are imported lazily).
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import memplan
import memplan.services

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
FRONT_DOOR = "memplan"
SERVICES = "memplan.services"
DOORS = {FRONT_DOOR: memplan, SERVICES: memplan.services}
FOUNDATION = {f"memplan.{name}" for name in ("errors", "units", "fileio", "budget", "problem", "run_options",
                                             "vocabulary", "progress", "plots", "registry")}
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# benchmark file -> {internal module it imports: why it reaches past the front door}
COMPONENT_BENCHMARKS = {
    "autoswap.py": {
        "memplan.reports.sweep": "SweepResult, the type of Fig. 9's sweep",
        "memplan.pool": "Fig. 10 spells out autoswap:bo+smartpool's composition (pool.layout, pool.with_pool)",
        "memplan.pool.search": "compiles the pool search's kernel before anything is timed",
    },
    "distributed_sim.py": {
        "memplan.zoo.workload": "wraps its own MLP as a Workload",
        "memplan.workflows.distributed": "wrap_workload: the DDP/FSDP ranks it measures",
        "memplan.cost.network": "the collective cost model, checked against DeepBench and nccl-tests",
    },
    "dqn.py": {
        "memplan.planners.dqn": "the DQN planner's graph, floor, shipped weights and fresh network",
        "memplan.planners.dqn.env": "times DQN's environment (steps per second)",
        "memplan.planners.dqn.train": "times DQN's training from scratch",
        "memplan.planners.kit.saved": "saved_gaps: TFLMS's candidate count (its baseline's parameter)",
    },
    "executor.py": {"memplan.workflows.torch_tools": "BASELINES: the PyTorch tools it runs beside the plans"},
    "frontier.py": {"memplan.planners.bound": "lower_bound: the proven bound every planner is held to"},
    "gpu_sanitizer.py": {
        "memplan.testing.cuda_rules": "CudaRules: the dry run checks its cases against CUDA's rules on the CPU",
        "memplan.workflows.cuda_graph": "on_cuda_runtime: a CPU step's copy lanes and capture on that stand-in",
    },
    "gpu_unseen.py": {
        "memplan.tracing.opinfo": "what the tracer counts as an op and its fresh tensors, measured op by op",
    },
    "joint.py": {
        "memplan.planners.home": "swaps HOME's chunk maker for threads (the parallel table)",
        "memplan.planners.home.pso": "times HOME's swarm chunks",
        "memplan.planners.kit.featuremaps": "times the policy evaluator on a trace's feature maps",
        "memplan.planners.kit.policy": "times the policy evaluator",
        "memplan.workflows.maxbatch": "search: the largest batch that fits, planner by planner (Table 2)",
        "memplan.zoo.tasks": "the inputs and loss of the Plain-20 model it builds",
        "memplan.zoo.workload": "builds its Plain-20 workload",
    },
    "op_times.py": {
        "memplan.cost.calibrate": "slug: results filed under the GPU's name",
        "memplan.cost.calibrate_cpu": "cpu_model: the CPU's name in the results",
        "memplan.cost.profiles": "DeviceProfile, the type of the profile it times against",
    },
    "pool.py": {"memplan.pool.native": "builds the native search before anything is timed"},
    "pool_cold.py": {"memplan.pool.native": "builds the native search before anything is timed"},
    "pool_large.py": {
        "memplan.pool.problem": "make_problem: a large problem tiled from a trace's",
        "memplan.pool.synthetic": "the synthetic problem families",
    },
    "pool_preorders.py": {
        "memplan.pool.greedy": "the conflict graph the search runs on",
        "memplan.pool.search": "screens the search's preorders on its internals",
    },
    "pool_training.py": {
        "memplan.pool.replay_allocator": "the replay allocator, replayed on the host (dry run)",
        "memplan.pool.requests": "the planned step's allocation requests",
        "memplan.testing.requests": "records and replays a real step's requests on the CPU",
    },
    "ucudnn.py": {
        "memplan.conv.fit": "fits the family time model to DeepBench",
        "memplan.conv.kernels": "the convolution kernels it times",
        "memplan.conv.options": "the micro-batch policies and options of paper 003",
        "memplan.conv.sources": "conv time sources: the model's, and timed on this CPU",
        "memplan.conv.timemodel": "writes the fitted coefficients",
        "memplan.conv.wr": "times WR's dynamic program",
        "memplan.conv.wd": "times WD's fronts and ILP",
        "memplan.conv.decide": "WR and WD decided for a traced model (Fig. 13)",
        "memplan.model": "CONV_KERNELS: the kernel kinds of Fig. 9",
    },
    "vdnn.py": {
        "memplan.planners.vdnn": "mode_plan: each vDNN mode planned alone (Table III, Fig. 9)",
        "memplan.pool.poolsize": "smallest_pool: pool size by order and heuristic",
        "memplan.zoo.vgg": "VGG's blocks, for the constructed network and the VGG variants",
        "memplan.zoo.registry": "VGG-16's spec for its variants; the real model whose outputs it compresses",
        "memplan.zoo.workload": "builds the VGG variants as workloads",
    },
}


def _module_path(module: str) -> bool:
    """Whether `module` (a dotted name under memplan) is a module or package in the source tree."""
    base = ROOT.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) of every memplan import in `path`; `from memplan.x
    import y` where y is a submodule counts as module memplan.x.y, and `from memplan import y`
    as memplan.y unless the front door exports y."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == FRONT_DOOR]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == FRONT_DOOR:
            for a in node.names:
                if node.module in DOORS and a.name in DOORS[node.module].__all__:
                    found.append((node.module, [a.name], node.lineno))
                elif node.module == FRONT_DOOR or _module_path(f"{node.module}.{a.name}"):
                    found.append((f"{node.module}.{a.name}", [], node.lineno))
                else:
                    found.append((node.module, [a.name], node.lineno))
    return found


PLAIN_VALUES = (bool, int, float, str, bytes, type(None))  # equal values may be one object: matched by name


@cache
def _exported_objects() -> dict[int, str]:
    """id of every object the doors export -> its public name (`door.name`)."""
    return {id(getattr(door, name)): f"{path}.{name}" for path, door in DOORS.items() for name in door.__all__}


def _exported_as(module: str, name: str) -> str | None:
    """The doors' name for `module.name`, if one exports that very object (a plain value: if one
    exports it from that module, under its own name or another)."""
    obj = getattr(importlib.import_module(module), name, None)
    if not isinstance(obj, PLAIN_VALUES):
        return _exported_objects().get(id(obj))
    for path, door in DOORS.items():
        for public, target in door._EXPORTS.items():
            source, _, attribute = target.partition(":")
            if source == module and (attribute or public) == name:
                return f"{path}.{public}"
    return None


def test_benchmarks_reach_the_library_through_the_front_door():
    files = sorted(p.name for p in BENCH.glob("*.py"))
    problems = [f"COMPONENT_BENCHMARKS lists {name}, which is not a benchmark"
                for name in COMPONENT_BENCHMARKS if name not in files]
    for name in files:
        listed = COMPONENT_BENCHMARKS.get(name, {})
        used = set()
        for module, names, line in _imports(BENCH / name):
            if module in DOORS or module in FOUNDATION:
                continue
            if module not in listed and module not in used:
                problems.append(f"{name}:{line} imports {module}: import from `memplan` or `memplan.services` (export "
                                "the name there), or list the pair in COMPONENT_BENCHMARKS with why")
            used.add(module)
            for imported in names:
                if public := _exported_as(module, imported):
                    door, _, short = public.rpartition(".")
                    problems.append(f"{name}:{line} imports {imported} from {module}: {door} exports it "
                                    f"(`from {door} import {short}`)")
        problems += [f"COMPONENT_BENCHMARKS[{name!r}] lists {module}, which it no longer imports (stale)"
                     for module in sorted(set(listed) - used)]
    assert not problems, "\n".join(problems)


def test_every_public_name_resolves_and_import_memplan_stays_cheap():
    for path, door in DOORS.items():
        missing = [name for name in door.__all__ if not hasattr(door, name)]
        assert not missing, f"{path}.__all__ names that do not resolve: {missing}"
        assert door.__all__ == sorted(set(door.__all__))
    assert not set(memplan.__all__) & set(memplan.services.__all__), "a name is in both doors"
    probe = "import memplan, sys; print('numpy' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "False"], f"`import memplan` imports numpy, torch: {out.stdout.strip()}"


def test_every_name_of_the_front_door_is_on_a_page_of_the_documentation():
    """Each name `import memplan` offers is in the prose or an example of README.md or a docs/ page (the
    generated reference at the end of docs/api.md does not count: it lists them all by construction)."""
    text = "\n".join(page.read_text() for page in DOCS)
    undocumented = [name for name in memplan.__all__ if not re.search(rf"(?<![\w.]){re.escape(name)}\b|memplan\.{name}\b",
                                                                       text)]
    assert not undocumented, f"on no page: {undocumented}"
    assert 30 <= len(memplan.__all__) <= 40, f"{len(memplan.__all__)} names: the front door is for what a user needs"
