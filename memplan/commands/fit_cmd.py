"""`memplan fit`: MODEL on N x DEVICE: the largest batch per rank per planner, time, memory."""

from __future__ import annotations

from ..problem import DEFAULT_PROFILE
from ..units import format_bytes
from .base import command
from .models import use_working_dir
from .options import add_json_flag, positive_int
from .output import emit_json


@command("fit")
def add_fit(sub) -> None:
    """Register `fit`."""
    p = sub.add_parser("fit", help="largest batch per rank of a DDP/FSDP2 job per planner, with time and memory")
    p.add_argument("model", help="zoo model name, hf:<name>, tv:<name> or module:function")
    p.add_argument("--world-size", type=int, required=True, help="ranks (GPUs) in the job")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help="the device profile: its memory per rank and its links")
    engine = p.add_mutually_exclusive_group()
    engine.add_argument("--fsdp", dest="engine", action="store_const", const="fsdp", default="fsdp",
                        help="FSDP2 (default)")
    engine.add_argument("--ddp", dest="engine", action="store_const", const="ddp", help="DistributedDataParallel")
    p.add_argument("--planners", default=None, help="comma-separated planner names "
                   "(default none,checkpoint-all,sqrt-n,save-on-cpu)")
    p.add_argument("--limit", type=positive_int, default=1 << 12, help="largest batch per rank tried")
    p.add_argument("--config", nargs="+", action="extend", default=[], metavar="KEY=VALUE", help="model options")
    add_json_flag(p)
    p.set_defaults(func=run_fit)


def run_fit(args) -> int:
    """Search each planner's batch and print the table."""
    # torch takes a second to import: only the commands that build a model pay for it
    from ..services import FIT_PLANNERS, fit_distributed, parse_model_config

    use_working_dir()
    given = args.planners
    planners = FIT_PLANNERS if given is None else tuple(p.strip() for p in given.split(",") if p.strip())
    out = fit_distributed(args.model, args.world_size, args.profile, engine=args.engine, planners=planners,
                          limit=args.limit, **parse_model_config(args.config))
    if args.json:
        emit_json(out)
        return 0
    print(f"{out['model']} on {out['world_size']} x {out['profile']} ({out['engine']}, "
          f"{format_bytes(out['memory_bytes'])} per rank; simulated)")
    width = max(len(row["planner"]) for row in out["planners"])
    for row in out["planners"]:
        if not row["max_batch"]:
            print(f"  {row['planner']:<{width}}  does not fit at batch 1")
            continue
        batch = f">= {row['max_batch']}" if row["at_limit"] else str(row["max_batch"])
        memory = ", ".join(f"{k} {format_bytes(v)}" for k, v in row["memory"].items() if v)
        print(f"  {row['planner']:<{width}}  batch/rank {batch:<7} step {row['iteration_s'] * 1e3:.2f} ms  "
              f"{row['samples_per_s']:.1f} samples/s  peak {format_bytes(row['peak_bytes'])}  [{memory}]")
    if any(row["at_limit"] for row in out["planners"]):
        print(f"  (>=: the largest batch tried, --limit {out['limit']}, fits; raise --limit to search further)")
    return 0
