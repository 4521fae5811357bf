"""Paper 002 (the DQN planner) in simulation: Fig. 5, training cost, inference time, transfer.

    .venv/bin/python benchmarks/dqn.py [--only fig5,cost,transfer] [--models a,b] [--train-s S]

Writes benchmarks/results/dqn_*.{md,json,png}:
  fig5      Fig. 5: simulated overhead against memory reduction (1 - simulated peak / unconstrained
            peak) for `dqn` (trained on each budget within --train-s seconds, fine-tuning the
            shipped weights) and the paper's baselines: memonger-like `sqrt-n` (segment counts),
            SuperNeurons' three modes (`superneurons-modes:*`) and TFLMS-like `tflms` (swap counts).
            For every baseline point, whether `dqn`'s curve (linear between its points) is at or
            below it.
  cost      environment steps per second (resnet18-cifar), wall time to train `dqn` from scratch on
            resnet18-cifar at 70% until its best plan is within 5% of the best it evaluates, and
            `dqn:pretrained` planning time on resnet50 (ImageNet) batch 256.
  transfer  the shipped weights (trained on vgg11-cifar only) applied greedily to vgg16-cifar and
            resnet34-cifar, against `dqn` trained on the target from scratch.
All numbers are simulated (the shared simulator over the roofline cost model of the paper's
GTX 1080 Ti) and the training runs are short: this host has 2 cores shared with other work.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np

from memplan import InfeasibleBudgetError, Problem, simulate
from memplan.services import DQNTrainConfig, DQN_MIN_BYTES, NO_LIMIT, plan_problem
from memplan.budget import bytes_to_json
from memplan.fileio import atomic_write_text
from memplan.planners.dqn import (
    SHIPPED_WEIGHTS,
    build_graph,
    floor_bytes,
    fresh_network,
)
from memplan.planners.dqn.env import Env
from memplan.planners.dqn.train import Instance, one_thread, train
from memplan.planners.kit.saved import saved_gaps

sys.path.insert(0, str(Path(__file__).parent))
from autoswap import get_trace  # noqa: E402  (the sibling benchmark's trace cache)

RESULTS = Path(__file__).parent / "results"
PROFILE = "gtx1080ti"  # the paper's GPU
# (model, batch): ResNet and VGG at two depths (CIFAR-10), UNet, char-LSTM, k-means, SD ResNet.
FIG5_MODELS = (("resnet18-cifar", 128), ("resnet34-cifar", 128), ("vgg11-cifar", 128), ("vgg16-cifar", 128),
               ("unet", 4), ("lstm", 64), ("kmeans", 65536), ("stochastic_depth", 128))
SHARES = (0.97, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)  # dqn budgets, as shares of the peak (those above its floor)
FLOOR_MARGIN = 1.002  # and one budget just above its floor (every candidate away)
SEGMENTS = (2, 3, 4, 6, 8, 12)  # sqrt-n segment counts (memonger's recomputation choices)
TFLMS_SHARES = (0.1, 0.25, 0.5, 0.75, 1.0)  # tflms swap counts, as shares of the candidates
MODES = ("recompute", "swap", "both")  # superneurons-modes variants
TRAIN_S = 15.0  # dqn training seconds per (model, budget) in fig5
EPISODES = 60  # dqn episodes per (model, budget) in fig5 (the time limit usually stops it first)
COST_MODEL, COST_BATCH, COST_SHARE = "resnet18-cifar", 128, 0.7
COST_EPISODES, COST_TRAIN_S = 150, 300.0  # the training-cost run (the target: < 600 s)
CONVERGED = 0.05  # "within 5% of its best evaluated plan" (relative overhead)
STEP_EPISODES = 10  # random episodes timed for steps per second
INFER_MODEL, INFER_BATCH, INFER_SHARE = "resnet50", 256, 0.7
TRANSFER_SOURCE = ("vgg11-cifar", 128)  # what the shipped weights were trained on
TRANSFER_TARGETS = (("vgg16-cifar", 128), ("resnet34-cifar", 128))
TRANSFER_SHARES = (0.8, 0.6)

log = logging.getLogger("dqn-bench")


def point(problem: Problem, planner: str, budget: int = NO_LIMIT, **params) -> dict | None:
    """One simulated point under `budget` bytes (NO_LIMIT: none): the plan's peak, reduction and
    overhead; None when infeasible."""
    trace = problem.trace
    started = time.perf_counter()
    try:
        result = plan_problem(problem.at(budget), planner, simulate_result=False, **params)
    except InfeasibleBudgetError:
        return None
    seconds = time.perf_counter() - started
    sim = simulate(trace, result, cost=problem.cost, budget=budget)
    if not sim.feasible:
        return None
    peak = trace.peak_load_bytes
    return {"planner": planner, "params": {k: v for k, v in params.items() if k != "weights"},
            "budget_bytes": bytes_to_json(budget), "peak_bytes": int(sim.peak_load_bytes),
            "reduction": 1.0 - sim.peak_load_bytes / peak, "overhead": float(sim.overhead), "plan_s": seconds}


def baseline_points(problem: Problem) -> list[dict]:
    """The baselines' points, with no budget: sqrt-n segment counts, superneurons' modes, tflms swap counts."""
    out = [point(problem, "sqrt-n", segments=s) for s in SEGMENTS]
    out += [point(problem, f"superneurons-modes:{m}") for m in MODES]
    candidates = _candidates(problem.trace)
    counts = sorted({max(1, math.ceil(q * candidates)) for q in TFLMS_SHARES})
    out += [point(problem, "tflms", count=c) for c in counts]
    return [p for p in out if p is not None]


def _candidates(trace) -> int:
    return len(saved_gaps(trace, 0))


def dqn_points(problem: Problem, train_s: float) -> list[dict]:
    """`dqn` at each share of the peak above its floor, and just above the floor."""
    peak = problem.trace.peak_load_bytes
    floor = floor_bytes(build_graph(problem.trace, problem.cost, peak - 1, DQN_MIN_BYTES))
    budgets = [int(s * peak) for s in SHARES if s * peak > floor * FLOOR_MARGIN] + [int(floor * FLOOR_MARGIN)]
    out = []
    for budget in budgets:
        if budget >= peak:
            continue
        p = point(problem, "dqn", budget, episodes=EPISODES, time_limit_s=train_s)
        if p is not None:
            out.append({**p, "share": budget / peak})
    return out


def curve_at(points: list[dict], reduction: float) -> float | None:
    """dqn's overhead at `reduction`, linear between its points (0 at no reduction); None beyond its reach."""
    xs = [0.0] + [p["reduction"] for p in sorted(points, key=lambda p: p["reduction"])]
    ys = [0.0] + [p["overhead"] for p in sorted(points, key=lambda p: p["reduction"])]
    ys = list(np.minimum.accumulate(np.array(ys)[::-1])[::-1])  # a point reaching further also serves less
    if reduction > xs[-1] + 1e-9:
        return None
    return float(np.interp(reduction, xs, ys))


def verdicts(dqn: list[dict], baselines: list[dict]) -> list[dict]:
    """Per baseline point: dqn's overhead at its reduction and whether dqn is at or below it."""
    out = []
    for b in baselines:
        ours = curve_at(dqn, b["reduction"])
        out.append({"planner": b["planner"], "params": b["params"], "reduction": b["reduction"],
                    "overhead": b["overhead"], "dqn_overhead": ours,
                    "dqn_at_or_below": ours is not None and ours <= b["overhead"] + 1e-4})
    return out


def run_fig5(models, train_s: float) -> dict:
    """Fig. 5 for every model; writes dqn_fig5.{json,md,png}."""
    rows = _previous_fig5()
    for model, batch in models:
        trace = get_trace(model, batch)
        problem = Problem.of(trace, profile=PROFILE)
        started = time.perf_counter()
        base = baseline_points(problem)
        ours = dqn_points(problem, train_s)
        rows.pop(model, None)
        rows[model] = {"batch": batch, "ops": len(trace.ops), "peak_bytes": trace.peak_load_bytes,
                       "baselines": base, "dqn": ours, "verdicts": verdicts(ours, base)}
        log.info("fig5 %s: %d baseline and %d dqn points in %.0f s", model, len(base), len(ours),
                 time.perf_counter() - started)
        _write_json("dqn_fig5.json", {"profile": PROFILE, "train_s": train_s, "simulated": True, "models": rows})
    _write_fig5_md(rows, train_s)
    _plot_fig5(rows)
    return rows


def _previous_fig5() -> dict:
    """Rows of an earlier run (a run on some models keeps the others' rows)."""
    path = RESULTS / "dqn_fig5.json"
    return json.loads(path.read_text())["models"] if path.exists() else {}


def _write_fig5_md(rows: dict, train_s: float) -> None:
    lines = [f"# Paper 002 Fig. 5 in simulation ({PROFILE} profile; dqn trained {train_s:.0f} s per budget)", "",
             ("Simulated overhead at the memory reduction each plan reaches (1 - simulated peak / unconstrained "
              "peak). `baseline points met` counts the baseline points that dqn's curve (linear between its "
              "points) meets or beats; a point beyond dqn's deepest reduction counts as not met."), "",
             "| model | dqn points (reduction: overhead) | baseline points met | not met |",
             "| --- | --- | --- | --- |"]
    for model, row in rows.items():
        ours = ", ".join(f"{p['reduction'] * 100:.0f}%: {p['overhead'] * 100:.1f}%" for p in row["dqn"])
        met = sum(v["dqn_at_or_below"] for v in row["verdicts"])
        missed = "; ".join(f"{_label(v)} ({v['reduction'] * 100:.0f}%: {v['overhead'] * 100:.1f}% vs dqn "
                           f"{'-' if v['dqn_overhead'] is None else format(v['dqn_overhead'] * 100, '.1f') + '%'})"
                           for v in row["verdicts"] if not v["dqn_at_or_below"])
        lines.append(f"| {model} | {ours} | {met}/{len(row['verdicts'])} | {missed or '-'} |")
    atomic_write_text(RESULTS / "dqn_fig5.md", "\n".join(lines) + "\n")


def _label(p: dict) -> str:
    params = ",".join(f"{k}={v}" for k, v in p["params"].items())
    return f"{p['planner']}({params})" if params else p["planner"]


def _plot_fig5(rows: dict) -> None:
    import matplotlib  # local: the Agg backend must be chosen before pyplot is imported, and only Fig. 5 plots
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 4
    fig, axes = plt.subplots(math.ceil(len(rows) / cols), cols, figsize=(16, 4 * math.ceil(len(rows) / cols)),
                             squeeze=False)
    styles = {"dqn": ("C3", "o-"), "sqrt-n": ("C0", "s--"), "tflms": ("C2", "^--"), "superneurons-modes": ("C1", "D")}
    for ax, (model, row) in zip(axes.flat, rows.items()):
        groups = {"dqn": row["dqn"]}
        for p in row["baselines"]:
            groups.setdefault(p["planner"].split(":")[0], []).append(p)
        for name, pts in groups.items():
            pts = sorted(pts, key=lambda p: p["reduction"])
            color, style = styles[name]
            ax.plot([p["reduction"] * 100 for p in pts], [p["overhead"] * 100 for p in pts], style, color=color,
                    label=name)
        ax.set_title(f"{model} (batch {row['batch']})")
        ax.set_xlabel("memory reduction (%)")
        ax.set_ylabel("overhead (%)")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(rows):]:
        ax.axis("off")
    axes.flat[0].legend()
    fig.suptitle(f"Paper 002 Fig. 5, SIMULATED on the {PROFILE} profile: overhead vs memory reduction")
    fig.tight_layout()
    fig.savefig(RESULTS / "dqn_fig5.png", dpi=90)
    plt.close(fig)


def steps_per_second(trace, cost) -> dict:
    """Random-policy episodes: environment steps per second, alone and with the end-of-episode simulation."""
    graph = build_graph(trace, cost, int(COST_SHARE * trace.peak_load_bytes), DQN_MIN_BYTES)
    env = Env(graph)
    rng = np.random.default_rng(0)
    env.outcome() if env.done else None
    steps, stepping, outcomes = 0, 0.0, 0.0
    for _ in range(STEP_EPISODES):
        started = time.perf_counter()
        env.reset()
        while not env.done:
            env.step(int(rng.choice(np.flatnonzero(env.valid_mask()))))
            steps += 1
        middle = time.perf_counter()
        env.outcome()
        stepping += middle - started
        outcomes += time.perf_counter() - middle
    return {"model": COST_MODEL, "ops": len(trace.ops), "candidates": len(graph.gaps), "episodes": STEP_EPISODES,
            "steps": steps, "steps_per_s": steps / stepping, "steps_per_s_with_rewards": steps / (stepping + outcomes),
            "episode_simulation_s": outcomes / STEP_EPISODES}


def training_cost(trace, cost) -> dict:
    """Train from scratch on COST_MODEL at COST_SHARE; when the best plan came within CONVERGED of the end's."""
    graph = build_graph(trace, cost, int(COST_SHARE * trace.peak_load_bytes), DQN_MIN_BYTES)
    net = fresh_network(0)
    config = DQNTrainConfig(episodes=COST_EPISODES, time_limit_s=COST_TRAIN_S, eval_every=5, seed=0)
    report = train(net, [Instance(graph=graph, env=Env(graph))], config, progress=False)
    best, trajectory = math.inf, []
    for row in report.history:
        best = min([best, row["overhead"], *row.get("greedy_overhead", [])])
        trajectory.append((row["elapsed_s"], row["episode"], best))
    final = trajectory[-1][2]
    reached = next(((s, e) for s, e, b in trajectory if b <= final * (1 + CONVERGED) + 1e-12), (None, None))
    return {"model": COST_MODEL, "batch": COST_BATCH, "share": COST_SHARE, "episodes": report.episodes,
            "steps": report.steps, "wall_s": report.wall_s, "best_overhead": final,
            "first_best_overhead": trajectory[0][2], "within_5pct_at_s": reached[0], "within_5pct_episode": reached[1],
            "trajectory": [{"elapsed_s": s, "episode": e, "best_overhead": b} for s, e, b in trajectory]}


def inference_time() -> dict:
    """`dqn:pretrained` (shipped weights) planning time on resnet50 batch 256."""
    trace = get_trace(INFER_MODEL, INFER_BATCH)
    problem = Problem.of(trace, profile=PROFILE)
    with one_thread():
        p = point(problem, "dqn:pretrained", int(INFER_SHARE * trace.peak_load_bytes))
    return {"model": INFER_MODEL, "batch": INFER_BATCH, "ops": len(trace.ops), "share": INFER_SHARE, "point": p}


def run_cost() -> dict:
    trace = get_trace(COST_MODEL, COST_BATCH)
    cost = Problem.of(trace, profile=PROFILE).cost
    out = {"profile": PROFILE, "simulated": True, "steps": steps_per_second(trace, cost)}
    log.info("steps per second: %s", out["steps"])
    out["inference"] = inference_time()
    log.info("inference: %s", out["inference"])
    out["training"] = training_cost(trace, cost)
    log.info("training: %s", {k: v for k, v in out["training"].items() if k != "trajectory"})
    _write_json("dqn_cost.json", out)
    return out


def run_transfer(train_s: float) -> dict:
    """Shipped weights (vgg11-cifar) greedy on the targets, against dqn trained there from scratch."""
    rows = []
    for model, batch in TRANSFER_TARGETS:
        trace = get_trace(model, batch)
        problem = Problem.of(trace, profile=PROFILE)
        for share in TRANSFER_SHARES:
            budget = int(share * trace.peak_load_bytes)
            pre = point(problem, "dqn:pretrained", budget)
            direct = point(problem, "dqn", budget, weights="none", episodes=EPISODES, time_limit_s=train_s)
            rows.append({"model": model, "batch": batch, "share": share, "pretrained": pre, "trained_here": direct})
            log.info("transfer %s %.0f%%: %s / %s", model, share * 100, pre and pre["overhead"],
                     direct and direct["overhead"])
    out = {"profile": PROFILE, "simulated": True, "source": TRANSFER_SOURCE, "weights": SHIPPED_WEIGHTS.name,
           "train_s": train_s, "rows": rows}
    _write_json("dqn_transfer.json", out)
    return out


def _write_json(name: str, data) -> None:
    atomic_write_text(RESULTS / name, json.dumps(data, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="fig5,cost,transfer")
    parser.add_argument("--models", default=None, help="comma-separated fig5 models (default: all eight)")
    parser.add_argument("--train-s", type=float, default=TRAIN_S, help="dqn training seconds per budget")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    RESULTS.mkdir(exist_ok=True)
    only = set(args.only.split(","))
    models = FIG5_MODELS if args.models is None else [m for m in FIG5_MODELS if m[0] in args.models.split(",")]
    if "fig5" in only:
        run_fig5(models, args.train_s)
    if "cost" in only:
        run_cost()
    if "transfer" in only:
        run_transfer(args.train_s)


if __name__ == "__main__":
    main()
