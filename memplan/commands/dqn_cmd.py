"""`memplan dqn train`: train the DQN planner's network (paper 002) on traces and budgets, save its weights."""

from __future__ import annotations

import sys

from ..problem import DEFAULT_PROFILE
from ..units import format_bytes
from .base import command
from .options import add_json_flag, budgets_option, nonnegative_int, output_of, positive_float, positive_int
from .output import emit_json


@command("dqn")
def add_dqn(sub) -> None:
    """Register `memplan dqn` and its `train` sub-command."""
    p = sub.add_parser("dqn", help="the DQN planner of paper 002: train its network")
    verbs = p.add_subparsers(dest="dqn_command", required=True, parser_class=type(p))
    t = verbs.add_parser("train", help="train on traces and budgets, write the weights (JSON)",
                         description=__doc__.splitlines()[0])
    t.add_argument("traces", nargs="+", help="trace files (memplan JSON lines or an importable format)")
    t.add_argument("--budgets", type=budgets_option, default=None,
                   help="comma-separated sizes or shares of each trace's peak (default: per trace, a quarter and "
                        "three quarters of the way from the lowest load the agent can reach to the peak)")
    t.add_argument("--profile", default=DEFAULT_PROFILE,
                   help=f"the cost model's device profile (default {DEFAULT_PROFILE})")
    t.add_argument("--episodes", type=positive_int, default=200, help="training episodes (default 200)")
    t.add_argument("--time-limit", type=positive_float, default=None, metavar="S", help="stop after S seconds")
    t.add_argument("--init", default=None, metavar="FILE", help="weights to start from (default: a fresh network)")
    t.add_argument("--min-bytes", type=nonnegative_int, default=None,
                   help="smallest activation the agent may act on (default 1 MiB)")
    t.add_argument("--seed", type=int, default=0, help="seed for the network, exploration and minibatches")
    t.add_argument("-o", "--output", type=output_of("JSON"), required=True, help="weights file to write (JSON)")
    add_json_flag(t)
    t.set_defaults(func=run_train)


def run_train(args) -> int:
    """Train, write the weights and print what each (trace, budget) reached."""
    # torch takes a second to import: only this command pays for it
    from ..services import DQNTrainConfig, DQN_MIN_BYTES, save_dqn_weights, train_dqn_weights

    min_bytes = DQN_MIN_BYTES if args.min_bytes is None else args.min_bytes
    problems, names = _problems(args, min_bytes)
    config = DQNTrainConfig(episodes=args.episodes, time_limit_s=args.time_limit, seed=args.seed)
    net, report = train_dqn_weights(problems, args.profile, init=args.init, config=config, min_bytes=min_bytes,
                                progress=not args.json and sys.stderr.isatty())
    rows = [{"trace": path, "budget_bytes": budget, "budget_share": budget / peak,
             "best_overhead": None if best is None else best.overhead}
            for (path, budget, peak), best in zip(names, report.best)]
    summary = {"output": str(args.output), "episodes": report.episodes, "steps": report.steps,
               "wall_s": report.wall_s, "profile": args.profile, "seed": args.seed, "problems": rows}
    save_dqn_weights(net, args.output, meta={k: v for k, v in summary.items() if k != "output"})
    if args.json:
        emit_json(summary)
    else:
        _print(summary)
    return 0


def _problems(args, min_bytes: int) -> tuple[list, list]:
    """(trace, budget) pairs and (path, budget, peak) names, every option checked first."""
    from .. import get_profile, load_any
    from ..problem import Problem
    # torch (see run_train)
    from ..services import dqn_default_budgets, load_dqn_weights

    get_profile(args.profile)
    if args.init is not None:
        load_dqn_weights(args.init)
    problems, names = [], []
    for path in args.traces:
        trace = load_any(path)
        peak = trace.peak_load_bytes
        budgets = [b.bytes_for(peak) for b in args.budgets] if args.budgets is not None else \
            dqn_default_budgets(trace, Problem.of(trace, profile=args.profile).cost, min_bytes)
        problems += [(trace, budget) for budget in budgets]
        names += [(path, budget, peak) for budget in budgets]
    return problems, names


def _print(summary: dict) -> None:
    print(f"trained {summary['episodes']} episodes ({summary['steps']} steps) in {summary['wall_s']:.1f} s; "
          f"weights written to {summary['output']}")
    for row in summary["problems"]:
        best = "no plan" if row["best_overhead"] is None else f"{row['best_overhead'] * 100:.2f}%"
        print(f"  {row['trace']} at {format_bytes(row['budget_bytes'])} ({row['budget_share'] * 100:.0f}%): "
              f"best overhead {best}")
