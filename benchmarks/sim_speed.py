"""How many full simulations per second the simulator runs (issue 49: >= 3,000/s on one core, the host priced).

Traces resnet50 at batch 256 with fake tensors (or reads --trace), builds random swap+recompute
plans, and times `Simulator.run` on each at 70% of the peak, plan preparation included: the 50
plans are simulated in turn, and the simulator keeps only the last few prepared, so every
evaluation lowers and prepares its plan (`evals_per_s`). Also timed: one plan simulated again
(`repeat_evals_per_s`: a bisection over caps, where the plan is prepared once and only the kernel
runs).

Every figure is wall-clock time (`*_per_s`) and, beside it, the process's CPU time (`cpu_*_per_s`):
on a loaded host the wall figure counts the time other processes took the core. The old revision's
figure is taken both ways too (its CPU figure by running its script with the process clock as its
timer).

With --against REV (e.g. 1a3f010, before the host was priced) the same measurement runs, in a
checkout of that revision in a temporary git worktree, before and after this one, and its figure
is recorded beside this one's (its own trace of resnet50: the tracer changed since).

    taskset -c 0 python benchmarks/sim_speed.py --json [--against 1a3f010] [--write]

--write puts the result in benchmarks/results/sim_speed.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from memplan import DEFAULT_PROFILE, Decision, Plan, Problem  # noqa: E402
from memplan.fileio import atomic_write_text  # noqa: E402
from memplan.services import Simulator  # noqa: E402

ROUNDS = 5  # the median of several rounds: this host's speed varies from run to run
TARGET = 3000.0  # evaluations per second issue 49 asks for
HOME_EVALUATOR_MS = (0.6, 21.8)  # HOME's time-cost evaluator, per evaluation (paper 004)
BUDGET_SHARE = 0.7  # of the trace's peak
REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


def random_plan(trace, rng: random.Random, share: float = 0.5) -> Plan:
    """Swap or recompute about `share` of the storages with a gap between two accesses."""
    decisions = []
    for sid, acc in enumerate(trace.accesses):
        if trace.storages[sid].persistent or len(acc) < 2 or rng.random() > share:
            continue
        k = max(range(len(acc) - 1), key=lambda j: acc[j + 1] - acc[j])
        if acc[k + 1] - acc[k] < 2:
            continue
        if trace.recomputable(sid) and rng.random() < 0.3:
            decisions.append(Decision(storage=sid, action="recompute", out_after=acc[k], back_before=acc[k + 1]))
        else:
            decisions.append(Decision(storage=sid, action="swap", out_after=acc[k], back_before=acc[k + 1],
                                      trigger=rng.randrange(acc[k] + 1, acc[k + 1] + 1)))
    return Plan(decisions=tuple(decisions))


def _rate(sim: Simulator, plans: list[Plan], budget: int, seconds: float) -> tuple[float, float]:
    """Evaluations per second of wall time and of CPU time over `seconds` (wall), cycling through `plans`."""
    runs, started, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - started < seconds:
        sim.run(plans[runs % len(plans)], budget)
        runs += 1
    return runs / (time.perf_counter() - started), runs / (time.process_time() - cpu)


def _medians(rates: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(r[0] for r in rates), statistics.median(r[1] for r in rates)


def measure(trace_path: str | None, n_plans: int, seconds: float) -> dict:
    """This checkout's figures."""
    if trace_path:
        from memplan import load_any

        trace, name = load_any(trace_path), trace_path
    else:
        from memplan import trace_workload

        trace, name = trace_workload("resnet50", 256, fake=True), "resnet50 batch 256 (fake)"
    sim = Simulator(trace, Problem.of(trace, profile=DEFAULT_PROFILE).cost)
    rng = random.Random(0)
    plans = [random_plan(trace, rng) for _ in range(n_plans)]
    budget = int(trace.peak_load_bytes * BUDGET_SHARE)
    for plan in plans:  # warm-up: numba compilation and per-chain caches
        sim.run(plan, budget)
    rates = [_rate(sim, plans, budget, seconds / ROUNDS) for _ in range(ROUNDS)]
    median, cpu = _medians(rates)
    repeat = _medians([_rate(sim, plans[:1], budget, seconds / ROUNDS / 2) for _ in range(ROUNDS)])
    levels = [sim.run(plan, budget) for plan in plans]
    return {"evals_per_s": median, "cpu_evals_per_s": cpu, "ms_per_eval": 1e3 / median,
            "rounds_evals_per_s": [r[0] for r in rates], "rounds_cpu_evals_per_s": [r[1] for r in rates],
            "repeat_evals_per_s": repeat[0], "cpu_repeat_evals_per_s": repeat[1], "trace": name, "ops": len(trace.ops),
            "storages": len(trace.storages), "decisions_per_plan": sum(len(p.decisions) for p in plans) / len(plans),
            "plans_feasible": sum(r.feasible for r in levels), "plans_hooked": sum(r.level == "hooked" for r in levels)}


# Runs a script with the process's CPU clock as its timer (time.perf_counter): an old revision's
# script times itself with perf_counter, and this gives its CPU-time figure.
CPU_CLOCK = ("import runpy, sys, time; time.perf_counter = time.process_time; sys.argv = sys.argv[1:]; "
             "runpy.run_path(sys.argv[0], run_name='__main__')")


def measure_at(rev: str, seconds: float) -> dict:
    """The same benchmark at revision `rev` (its own script and tracer), in a temporary git worktree, timed
    by the wall clock and then by the CPU clock."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev], check=True,
                       capture_output=True)
        try:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            script = [str(tree / "benchmarks" / "sim_speed.py"), "--json", "--seconds", str(seconds)]
            found = [json.loads(subprocess.run([sys.executable, *clock, *script], cwd=tree, env=env, check=True,
                                               capture_output=True, text=True).stdout.strip().splitlines()[-1])
                     for clock in ((), ("-c", CPU_CLOCK))]
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=True,
                           capture_output=True)
    return {"rev": rev, "evals_per_s": found[0]["evals_per_s"], "cpu_evals_per_s": found[1]["evals_per_s"],
            "ops": found[0]["ops"], "decisions_per_plan": found[0]["decisions_per_plan"]}


def to_markdown(out: dict) -> str:
    lines = ["| revision | evaluations/s (wall) | evaluations/s (CPU time) | ms each (wall) | trace | "
             "plans feasible / hooked |", "|---|---|---|---|---|---|",
             f"| this one | {out['evals_per_s']:,.0f} | {out['cpu_evals_per_s']:,.0f} | {out['ms_per_eval']:.3f} | "
             f"{out['ops']} ops, {out['decisions_per_plan']:.0f} decisions a plan | "
             f"{out['plans_feasible']} / {out['plans_hooked']} of 50 |",
             f"| this one, the same plan again | {out['repeat_evals_per_s']:,.0f} | "
             f"{out['cpu_repeat_evals_per_s']:,.0f} | {1e3 / out['repeat_evals_per_s']:.3f} | | |"]
    for old in out.get("against", []):
        lines.append(f"| {old['rev']} (before, then after) | {old['evals_per_s']:,.0f} | {old['cpu_evals_per_s']:,.0f} | "
                     f"{1e3 / old['evals_per_s']:.3f} | {old['ops']} ops, {old['decisions_per_plan']:.0f} "
                     f"decisions a plan | |")
    return "\n".join(lines) + (f"\n\nTarget: {TARGET:,.0f} evaluations/s; load average {out['load_average']:.1f} "
                               "(wall-clock figures count the time other processes took the core).\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", help="a trace file (default: resnet50 batch 256, fake tensors)")
    parser.add_argument("--plans", type=int, default=50, help="distinct random plans")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to time, all rounds together")
    parser.add_argument("--against", help="also time this git revision, before and after this checkout")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--write", action="store_true", help="write benchmarks/results/sim_speed.{json,md}")
    args = parser.parse_args()
    before = measure_at(args.against, args.seconds) if args.against else None
    out = {**measure(args.trace, args.plans, args.seconds), "target_evals_per_s": TARGET,
           "home_evaluator_ms": HOME_EVALUATOR_MS, "budget_share": BUDGET_SHARE}
    if args.against:
        after = measure_at(args.against, args.seconds)
        out["against"] = [{**before, **{key: statistics.mean([before[key], after[key]])
                                        for key in ("evals_per_s", "cpu_evals_per_s")},
                           "runs_evals_per_s": [before["evals_per_s"], after["evals_per_s"]],
                           "runs_cpu_evals_per_s": [before["cpu_evals_per_s"], after["cpu_evals_per_s"]]}]
    out["load_average"] = os.getloadavg()[0]
    if args.write:
        atomic_write_text(RESULTS / "sim_speed.json", json.dumps(out, indent=1) + "\n")
        atomic_write_text(RESULTS / "sim_speed.md", to_markdown(out))
    print(json.dumps(out) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
