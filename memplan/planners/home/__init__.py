"""HOME (paper 004 §3): keep, swap or recompute every feature map, chosen by a particle swarm.

The policy vector has one entry per feature map (memplan.planners.kit.featuremaps: 0 retain,
1 swap, 2 recompute); the swarm is Algorithms 1 and 3 exactly (memplan.planners.home.pso);
the Policy Evaluator is the shared simulator (memplan.planners.kit.policy). Particles are
spread over worker processes (memplan.planners.home.workers); the result depends on the
seed only, not on the number of workers, unless a time limit cuts the search short.

Registered names:
- `home`: iters = particles = 500 (§3.3), no time limit.
- `home:seeded` (ours, not the paper's): the first particles are the plans of Capuchin, TFLMS,
  sqrt-n, checkpoint-all and SuperNeurons at the budget, and the swarm's best is then improved
  by single-entry changes while they lower the overhead (a mutation step the paper's
  Algorithm 3 lacks: its swarm stops moving once every particle agrees with the best); the
  seed plans stay candidates, so it is never worse than one of them.
- `home:fast`: the same search under a time limit (default FAST_TIME_LIMIT_S), returning the
  best policy found when it runs out. Its evaluations, like `home`'s, are incremental: a
  policy that differs from an earlier one in a few entries reuses the recompute chains and
  rebuild checks those entries do not touch (memplan.sim.memo).

With a budget at or above the unconstrained peak nothing needs to move and the plan is
empty (HOME manages memory only when the model does not fit). When no particle fits the
budget, the uniform policies (all kept, all swapped, all recomputed where allowed) are tried;
the best of them that fits is returned, otherwise the infeasible-budget error names the
smallest budget under which one of them, or the best particle, fits.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from ...errors import MemplanError
from ...model import Action, Plan
from ...problem import Problem
from ...progress import progress_bar
from ...sim.simulate import simulator_of
from ..base import infeasible, register
from ..kit.featuremaps import DEFAULT_MIN_BYTES, feature_maps
from ..kit.fitting import fitting_plans
from ..kit.policy import INFEASIBLE, PolicyEvaluator
from ..kit.prefetch import DEFAULT_LEAD
from ..kit.refine import Refiner, policy_of
from ..kit.searched import search_report
from .pso import History, random_policies, swarm
from .workers import available_cores, make_chunks

log = logging.getLogger(__name__)

DEFAULT_ITERS = 500  # §3.3: "we empirically set both ... to 500"
DEFAULT_PARTICLES = 500
FAST_TIME_LIMIT_S = 20.0  # home:fast's default time limit
SEEDED_PARTICLES = 100  # home:seeded: fewer particles, more iterations within the time limit
SEED_PLANNERS = ("capuchin", "tflms", "sqrt-n", "checkpoint-all", "superneurons")  # home:seeded's first particles
PARALLEL_MIN_WORK = 20_000  # particles x feature maps below which worker processes cost more than they save


def home(problem: Problem, *, iters: int = DEFAULT_ITERS,
         particles: int = DEFAULT_PARTICLES, time_limit_s: float | None = None, workers: int = 0,
         min_bytes: int = DEFAULT_MIN_BYTES, lead: int = DEFAULT_LEAD, label: str = "home") -> Plan:
    """HOME's particle swarm search.

    Args:
        problem: the trace, its cap, its costs and the seed (memplan.problem).
        iters: swarm iterations (Algorithm 1).
        particles: particles per iteration.
        time_limit_s: stop after the iteration running when this many seconds have passed since the
            call (finding the feature maps and, for `home:seeded`, planning its seeds included).
        workers: worker processes (0: one per core when the search is large enough).
        min_bytes: smaller activations are not feature maps (they stay).
        lead: a prefetch is issued this many backward layers before the layer that needs it.
    Returns:
        The plan of the best policy, with its convergence in `plan.history`.
    Raises:
        MemplanError: iters or particles below 1.
        InfeasibleBudgetError: no policy tried fits (names the smallest peak seen).
    """
    return _home(problem, iters=iters, particles=particles, time_limit_s=time_limit_s, workers=workers,
                 min_bytes=min_bytes, lead=lead, name=label)


def _home(problem: Problem, *, iters: int, particles: int, time_limit_s: float | None, workers: int,
          min_bytes: int, lead: int, name: str, seeded: bool = False) -> Plan:
    """HOME's search; `seeded`: the first particles are other planners' plans (SEED_PLANNERS), a
    local search from the swarm's best follows, and those plans themselves stay candidates
    (`home:seeded` is never worse than a planner it was seeded with)."""
    if iters < 1 or particles < 1:
        raise MemplanError(f"planner {name!r}: iters and particles must be at least 1 (got {iters}, {particles})")
    deadline = math.inf if time_limit_s is None else time.monotonic() + time_limit_s  # what comes first counts too
    trace, budget_bytes = problem.trace, problem.budget_bytes
    if budget_bytes >= trace.peak_load_bytes:
        return Plan()
    fm = feature_maps(trace, min_bytes)
    evaluator = PolicyEvaluator(fm, problem.cost, budget_bytes, lead)
    if not len(fm):
        raise infeasible(budget_bytes, trace.peak_load_bytes, name)
    policies = random_policies(fm.allowed(), particles, np.random.default_rng(problem.seed))
    seeds: list[Plan] = []
    if seeded:
        seeds = fitting_plans(problem, SEED_PLANNERS, simulator_of(problem))
        starts = np.array([policy_of(fm, p.decisions)[0] for p in seeds], dtype=np.int8).reshape(-1, len(fm))
        policies[:len(starts)] = starts[:particles]
    started = time.monotonic()
    evaluator(policies[0])  # compiles the simulator before any worker is forked
    at_fork = evaluator.evaluations
    if workers == 0:
        workers = available_cores() if particles * len(fm) >= PARALLEL_MIN_WORK else 1
    best, score, history = _search(evaluator, policies, iters, workers, deadline, name)
    if seeded and score < INFEASIBLE:
        best, score = Refiner(evaluator).polish(best, deadline)
    if score >= INFEASIBLE and not seeds:
        best, score = _uniform_fallback(evaluator, best, name)
    found = [evaluator.plan(best)] if score < INFEASIBLE else []
    plan = min(found + seeds, key=lambda p: evaluator.simulator.run(p, budget_bytes).time_s)
    # worker processes count in their own copies of the evaluator, from what it had done when forked
    evaluations = evaluator.evaluations + (history.evaluations - workers * at_fork if workers > 1 else 0)
    return plan.with_meta(history=_history_record(history, len(fm), workers),
                          report=search_report(evaluations, time.monotonic() - started))


def _search(evaluator: PolicyEvaluator, policies: np.ndarray, iters: int, workers: int, deadline: float,
            name: str) -> tuple[np.ndarray, float, History]:
    started = time.monotonic()
    chunks = make_chunks(evaluator, policies, workers)
    try:
        with progress_bar(name, total=iters, unit=" it") as bar:

            def shown(it: int, best: float) -> None:
                bar.update()
                bar.set_postfix_str("none fits yet" if best >= INFEASIBLE else f"best overhead {best:.2%}",
                                    refresh=False)

            best, score, history = swarm(chunks, iters, INFEASIBLE, deadline, shown)
    finally:
        for chunk in chunks:
            chunk.close()
    log.info("%s: %d iterations (converged at %s) in %.1f s on %d worker(s), best score %.4f", name,
             len(history.best), history.converged_at, time.monotonic() - started, len(chunks), score)
    return best, score, history


def _uniform_fallback(evaluator: PolicyEvaluator, best: np.ndarray, name: str) -> tuple[np.ndarray, float]:
    """The best fitting uniform policy, when no particle fits; else the infeasible-budget error."""
    allowed = evaluator.fm.allowed()
    uniform = [np.full(len(allowed), Action.KEEP, np.int8), np.full(len(allowed), Action.SWAP, np.int8),
               np.where(allowed[:, Action.RECOMPUTE], Action.RECOMPUTE, Action.SWAP).astype(np.int8)]
    scored = sorted((evaluator(p), i) for i, p in enumerate(uniform))
    if scored[0][0] < INFEASIBLE:
        log.warning("%s: no particle fits the budget; using a uniform policy", name)
        return uniform[scored[0][1]], scored[0][0]
    raise infeasible(evaluator.budget_bytes, min(evaluator.smallest_cap(p) for p in uniform + [best]), name)


def _history_record(history: History, n: int, workers: int) -> dict:
    """`plan.history`: the Fig. 8 series (infeasible or empty entries as None)."""
    def clean(values):
        return [None if not math.isfinite(v) or v >= INFEASIBLE else round(float(v), 6) for v in values]

    return {"xlabel": "PSO iteration", "ylabel": "simulated overhead",
            "series": {"best": clean(history.best), "average": clean(history.mean), "worst": clean(history.worst)},
            "converged_at": history.converged_at, "feature_maps": n, "workers": workers}


register("home", "HOME (paper 004 §3): particle swarm over keep/swap/recompute per feature map",
         decides=("swap", "recompute"), label="home")(home)


def home_fast(problem: Problem, *, iters: int = DEFAULT_ITERS,
              particles: int = DEFAULT_PARTICLES, time_limit_s: float = FAST_TIME_LIMIT_S, workers: int = 0,
              min_bytes: int = DEFAULT_MIN_BYTES, lead: int = DEFAULT_LEAD) -> Plan:
    """`home` under a time limit: the best policy found when it runs out."""
    return home(problem, iters=iters, particles=particles, time_limit_s=time_limit_s,
                workers=workers, min_bytes=min_bytes, lead=lead, label="home:fast")


register("home:fast", "HOME's swarm under a time limit (default 20 s), best policy found by then",
         decides=("swap", "recompute"))(home_fast)


def home_seeded(problem: Problem, *, iters: int = DEFAULT_ITERS,
                particles: int = SEEDED_PARTICLES, time_limit_s: float = FAST_TIME_LIMIT_S, workers: int = 0,
                min_bytes: int = DEFAULT_MIN_BYTES, lead: int = DEFAULT_LEAD) -> Plan:
    """HOME's swarm with other planners' plans among its first particles (SEED_PLANNERS), then a
    mutation step: single-entry changes of the swarm's best, kept while they lower the overhead
    (a local search, `memplan.planners.kit.refine`), all within the time limit; the seed plans
    themselves (with their own prefetch triggers) stay candidates, the best simulated one wins."""
    return _home(problem, iters=iters, particles=particles, time_limit_s=time_limit_s, workers=workers,
                 min_bytes=min_bytes, lead=lead, name="home:seeded", seeded=True)


register("home:seeded", "HOME's swarm seeded with Capuchin, TFLMS, sqrt-n, checkpoint-all and SuperNeurons "
                        "plans, then a local search; within a time limit (default 20 s)",
         decides=("swap", "recompute"))(home_seeded)
