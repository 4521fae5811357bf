"""How many full simulations per second the simulator runs (issue: >= 1,000/s on one core).

Traces resnet50 at batch 256 with fake tensors (or reads --trace), builds random
swap+recompute plans, and times `Simulator.run` on each, plan preparation included.

    taskset -c 0 python benchmarks/sim_speed.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from memplan import DEFAULT_PROFILE, Decision, Plan, Problem, Simulator  # noqa: E402

ROUNDS = 5  # the median of several rounds: this host's speed varies from run to run
TARGET = 1000.0  # evaluations per second the issue asks for
HOME_EVALUATOR_MS = (0.6, 21.8)  # HOME's time-cost evaluator, per evaluation (paper 004)


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


def _rate(sim: Simulator, plans: list[Plan], budget: int, seconds: float) -> float:
    """Evaluations per second over `seconds`, cycling through `plans`."""
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        sim.run(plans[runs % len(plans)], budget)
        runs += 1
    return runs / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", help="a trace file (default: resnet50 batch 256, fake tensors)")
    parser.add_argument("--plans", type=int, default=50, help="distinct random plans")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to time, all rounds together")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.trace:
        from memplan import load_any

        trace, name = load_any(args.trace), args.trace
    else:
        from memplan import trace_workload

        trace, name = trace_workload("resnet50", 256, fake=True), "resnet50 batch 256 (fake)"
    sim = Simulator(trace, Problem.of(trace, profile=DEFAULT_PROFILE).cost)
    rng = random.Random(0)
    plans = [random_plan(trace, rng) for _ in range(args.plans)]
    budget = int(trace.peak_load_bytes * 0.7)
    for plan in plans:  # warm-up: numba compilation and per-chain caches
        sim.run(plan, budget)
    rates = [_rate(sim, plans, budget, args.seconds / ROUNDS) for _ in range(ROUNDS)]
    median = statistics.median(rates)
    out = {"evals_per_s": median, "ms_per_eval": 1e3 / median, "rounds_evals_per_s": rates,
           "target_evals_per_s": TARGET, "home_evaluator_ms": HOME_EVALUATOR_MS, "trace": name,
           "ops": len(trace.ops), "storages": len(trace.storages),
           "decisions_per_plan": sum(len(p.decisions) for p in plans) / len(plans)}
    print(json.dumps(out) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))


if __name__ == "__main__":
    main()
