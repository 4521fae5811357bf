"""`memplan compare`: every planner and PyTorch tool, simulated and measured, in one report."""

from __future__ import annotations

import shlex
import sys

from ..services import CALIBRATED_CPU_PROFILE, CALIBRATED_GPU_PROFILE, CompareSettings
from ..problem import DEFAULT_PROFILE
from ..units import format_bytes, parse_bytes
from .base import command
from .options import add_json_flag, output_folder, positive_int, torch_device
from .output import emit_json

_DEFAULTS = CompareSettings()  # the defaults of every option that lists names


@command("compare")
def add_compare(sub):
    """Register `memplan compare`."""
    p = sub.add_parser("compare", help="Pareto fronts (peak vs overhead) of every planner and PyTorch tool, "
                                       "simulated and measured (on the CPU or a GPU), and the largest batch of each")
    p.add_argument("--out", type=output_folder, default="benchmarks/results/compare",
                   help="folder of the report, the plots and the cache of finished points (made if missing; its "
                        "parent must exist)")
    p.add_argument("--models", default=",".join(_DEFAULTS.models), help="comma-separated zoo model names")
    p.add_argument("--planners", default=",".join(_DEFAULTS.sim_planners), help="planners simulated")
    p.add_argument("--run-planners", default=",".join(_DEFAULTS.run_planners),
                   help="planners measured on --device (none is always measured); empty for none")
    p.add_argument("--baselines", default=",".join(_DEFAULTS.baselines),
                   help="PyTorch tools measured on --device; empty for none")
    p.add_argument("--maxbatch-planners", default=",".join(_DEFAULTS.maxbatch_planners),
                   help="planners whose largest batch under --maxbatch-memory is searched; empty for none")
    p.add_argument("--budgets", default=",".join(_DEFAULTS.budgets), help="shares of the unplanned peak")
    p.add_argument("--sim-batch", type=positive_int, default=64, help="batch of the simulated traces")
    p.add_argument("--run-batch", type=positive_int, default=8, help="batch of the measured runs")
    p.add_argument("--steps", type=positive_int, default=5, help="measured steps per run (the first warms up)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help="the cost model's device profile of the simulated points")
    p.add_argument("--device", type=torch_device, default="cpu",
                   help="where the measured points train: cpu (default) or cuda")
    p.add_argument("--run-profile", default=None,
                   help=f"profile the measured points plan with (default: the --device, calibrated once per --out: "
                        f"{CALIBRATED_CPU_PROFILE} for this CPU, {CALIBRATED_GPU_PROFILE} for this GPU)")
    p.add_argument("--memory-cap", type=parse_bytes, default=None, metavar="SIZE",
                   help="measure under an emulated device of SIZE (as `run --memory-cap`); a point that cannot "
                        "fit says so in its cell")
    p.add_argument("--maxbatch-memory", default=None,
                   help="memory cap of the largest-batch search (default: the unplanned peak at --sim-batch)")
    p.add_argument("--maxbatch-limit", type=positive_int, default=256, help="largest batch the search tries")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Compute the missing points, write the report, print where it is."""
    from .. import compare  # torch takes a second to import: only this command pays for it
    from ..services import write_compare_report

    args.run_profile = args.run_profile or _default_run_profile(args.device)
    settings = CompareSettings(
        models=_names(args.models), sim_planners=_names(args.planners), run_planners=_names(args.run_planners),
        baselines=_names(args.baselines), maxbatch_planners=_names(args.maxbatch_planners),
        budgets=_names(args.budgets), sim_batch=args.sim_batch, run_batch=args.run_batch, steps=args.steps,
        profile=args.profile, run_profile=args.run_profile, device=args.device, memory_cap=args.memory_cap,
        maxbatch_limit=args.maxbatch_limit,
        maxbatch_memory=parse_bytes(args.maxbatch_memory) if args.maxbatch_memory else None)
    result = compare(settings, args.out, progress=not args.json and sys.stderr.isatty())
    files = write_compare_report(result, args.out, _command(args))
    if args.json:
        emit_json({**result, **files})
        return 0
    print(f"{result['computed']} points computed, {result['cached']} from the cache")
    print(f"report: {files['report']}")
    for p in result["points"]:
        if p["kind"] == "maxbatch" and "max_batch" in p:
            print(f"  {p['model']}: {p['method']} reaches batch {p['max_batch']} under "
                  f"{format_bytes(p['memory_bytes'])}")
    return 0


def _default_run_profile(device: str) -> str:
    return CALIBRATED_CPU_PROFILE if device == "cpu" else CALIBRATED_GPU_PROFILE


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


_OPTIONS = ("out", "models", "planners", "run_planners", "baselines", "maxbatch_planners", "budgets", "sim_batch",
            "run_batch", "steps", "profile", "device", "run_profile", "memory_cap", "maxbatch_memory",
            "maxbatch_limit")


def _command(args) -> str:
    """The command that reproduces this report, every option spelled out."""
    words = ["memplan", "compare"]
    for name in _OPTIONS:
        value = getattr(args, name)
        if value is not None and (name, value) != ("device", "cpu"):  # the default device, left implicit
            words += [f"--{name.replace('_', '-')}", str(value)]
    return shlex.join(words)
