"""`memplan run`: train a zoo model under a plan and measure it."""

from __future__ import annotations

from ..cli import add_json_flag, emit_json
from ..units import format_bytes


def add_parser(sub):
    """Register `run`."""
    p = sub.add_parser("run", help="train K steps under a plan and measure time and memory")
    p.add_argument("model", help="zoo model name (e.g. resnet18-cifar, hf:gpt2)")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--planner", default="none")
    p.add_argument("--budget", default=None, help="bytes, 8GiB or 60%% of the unplanned peak")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", default="cpu", help="where to train (cpu, cuda)")
    p.add_argument("--profile", default="h100", help="cost-model profile the planner plans for")
    p.add_argument("--check", action="store_true", help="also train without a plan and report max_param_diff")
    p.add_argument("--baseline", default=None, help="torch-checkpoint | save-on-cpu | compile-budget")
    p.add_argument("--seed", type=int, default=0)
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the measurement and print it."""
    from ..exec.measure import check_baseline, run_workload

    if args.baseline:
        check_baseline(args.baseline)
    out = run_workload(args.model, args.batch, planner=args.planner, budget=args.budget, steps=args.steps,
                       device=args.device, profile=args.profile, check=args.check, seed=args.seed)
    if args.json:
        emit_json(out)
        return 0
    ex = out["executor"]
    rows = [("model", f"{out['model']} batch {out['batch']}"), ("planner", out["planner"]),
            ("budget", format_bytes(out["budget_bytes"] or 0)),
            ("step time (s)", ", ".join(f"{t:.3f}" for t in out["step_time_s"])),
            ("peak allocated", _b(out["peak_allocated_bytes"])), ("peak reserved", _b(out["peak_reserved_bytes"])),
            ("host slab", format_bytes(ex["slab_bytes"])), ("swapped tensors", ex.get("offloaded", 0)),
            ("recompute regions", ", ".join(r or "<root>" for r in ex["recompute_regions"]) or "-"),
            ("skipped decisions", ex["skipped_decisions"]),
            ("predicted time (s)", out["predicted"].get("time_s", "-") if out["predicted"] else "-")]
    if "max_param_diff" in out:
        rows.append(("max_param_diff", f"{out['max_param_diff']:.3g}"))
    for key, value in rows:
        print(f"{key:<20} {value}")
    return 0


def _b(n) -> str:
    return "n/a (CPU)" if n is None else format_bytes(n)
