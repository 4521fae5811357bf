"""The DQN planner of paper 002: a learned swap-and-recompute policy over the operation graph.

Registered names:
- `dqn`: trains on the target trace and budget (Alg. 1) within `episodes` and
  `time_limit_s`, starting from `weights` (default: the weights shipped with memplan,
  when present), and returns the best plan it evaluated (Fig. 3).
- `dqn:pretrained`: greedy inference only, with the network of `weights` (default: the
  shipped weights).
- `dqn:refined` (ours): `dqn:pretrained`'s plan improved by a local search over keep / swap /
  recompute per feature map (`memplan.planners.kit.refine`); paper 002's planners are unchanged.

Both plan against the budget: saved activations of at least `min_bytes` are offloaded or
removed (recomputed) by the agent; the rest is kept. An episode ends as soon as the planned
load fits, which leaves no room for copies in flight, so the greedy policy also runs against
limits SLACKS below the budget (ours, not the paper's) and the best simulated plan wins. A
greedy plan the simulator finds infeasible (recomputation temporaries can overflow) is redone
against a limit lowered by the shortfall, up to RETRIES times; if no plan is left the planner
logs a warning and swaps every candidate (the floor plan). `weights=none` starts `dqn` from a
fresh network. Modules: `graph` (nodes, edges, features),
`env` (transitions and rewards), `net` (structure2vec and the Q head, weights files),
`train` (fitted Q-iteration). `net` and `train` hold the torch code and are imported by the
functions that use them: the planner registry imports this package for every command that
lists or looks up a planner, and those commands import no torch.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ...cost.model import Cost
from ...errors import MemplanError
from ...model import Plan, Trace
from ...problem import DEFAULT_PROFILE, Problem, cost_of
from ...sim.simulate import Simulator, simulator_of
from ...units import format_bytes
from ..base import get_planner, infeasible, refuse_without_ops, register
from ..kit.featuremaps import feature_maps
from ..kit.gaps import load_without
from ..kit.policy import INFEASIBLE, PolicyEvaluator
from ..kit.prefetch import gap_decisions
from ..kit.refine import Refiner, policy_of
from .env import Env, Outcome
from .graph import Graph, build_graph

if TYPE_CHECKING:
    from .net import QNet
    from .train import TrainConfig, TrainReport

log = logging.getLogger(__name__)

SHIPPED_WEIGHTS = Path(__file__).with_name("pretrained.json")
DEFAULT_MIN_BYTES = 2**20  # like AutoSwap's: a smaller activation is not worth an action
RETRIES = 3  # greedy attempts against a lowered limit before the floor plan
SLACKS = (0.0, 0.05, 0.1)  # greedy episodes also aim this share below the budget; the best simulated plan wins
FRESH = "none"  # the `weights` value that starts `dqn` from a fresh network, ignoring shipped weights
TRAIN_POINTS = (0.75, 0.25)  # default training budgets: this share of the way from the floor to the peak
FINE_TUNE_EPSILON = 0.3  # starting epsilon when training from existing weights (1.0 from scratch)
REFINE_LIMIT_S = 20.0  # dqn:refined's local search


@register("dqn", "paper 002: DQN swap/recompute policy trained on this trace (fine-tunes shipped weights)",
          decides=("swap", "recompute"))
def plan_dqn(problem: Problem, *, weights: str | None = None,
             episodes: int = 200, time_limit_s: float = 60.0, min_bytes: int = DEFAULT_MIN_BYTES,
             gamma: float = 0.99, lr: float = 1e-3, epsilon: float | None = None) -> Plan:
    """Train the Q network on this trace and budget, then return the best plan evaluated.

    Args:
        weights: a weights file to start from (default: the shipped weights, if any;
            `none`: a fresh network seeded with `seed`).
        episodes: training episodes (epsilon decays over them).
        time_limit_s: stop training after this many seconds.
        min_bytes: smallest activation the agent may act on.
        gamma, lr: discount and Adam step size.
        epsilon: starting epsilon (default 1.0 from scratch, 0.3 from weights).
    """
    from .train import Instance, TrainConfig, train

    net, from_file = _network(weights, problem.seed, required=False)
    graph = _graph(problem, min_bytes, "dqn")
    if graph is None:
        return Plan()
    start = epsilon if epsilon is not None else (FINE_TUNE_EPSILON if from_file else 1.0)
    config = TrainConfig(episodes=episodes, time_limit_s=time_limit_s, gamma=gamma, lr=lr, epsilon=start,
                         seed=problem.seed)
    sim = simulator_of(problem)
    candidates = _greedy_fitting(net, graph, sim)
    report = train(net, [Instance(graph=graph, env=Env(graph, simulator=sim))], config)
    log.info("dqn: %d episodes, %d steps in %.1f s", report.episodes, report.steps, report.wall_s)
    candidates += [report.best[0], *_greedy_fitting(net, graph, sim)]
    return _best_or_floor(graph, [c for c in candidates if c is not None])


@register("dqn:pretrained", "paper 002: greedy DQN policy from a weights file (default: the shipped weights)",
          decides=("swap", "recompute"))
def plan_dqn_pretrained(problem: Problem, *, weights: str | None = None,
                        min_bytes: int = DEFAULT_MIN_BYTES) -> Plan:
    """The greedy policy of a trained network, no training.

    Args:
        weights: the weights file (default: the shipped weights).
        min_bytes: smallest activation the agent may act on.
    """
    net, _ = _network(weights, problem.seed, required=True)
    graph = _graph(problem, min_bytes, "dqn:pretrained")
    if graph is None:
        return Plan()
    return _best_or_floor(graph, _greedy_fitting(net, graph, simulator_of(problem)))


@register("dqn:refined", "dqn:pretrained's greedy plan, then a local search over keep/swap/recompute per feature "
                        "map (ours, not paper 002's)", decides=("swap", "recompute"))
def plan_dqn_refined(problem: Problem, *, weights: str | None = None,
                     min_bytes: int = DEFAULT_MIN_BYTES, time_limit_s: float = REFINE_LIMIT_S) -> Plan:
    """The greedy policy of a trained network, improved by single-entry changes of its policy while
    they lower the simulated overhead (`memplan.planners.kit.refine`), within `time_limit_s`.

    Args:
        weights: the weights file (default: the shipped weights).
        min_bytes: smallest activation the agent (and the local search) may act on.
        time_limit_s: wall-clock limit of the local search.
    """
    start = plan_dqn_pretrained(problem, weights=weights, min_bytes=min_bytes)
    fm = feature_maps(problem.trace, min_bytes)
    if not start.decisions or not len(fm):
        return start
    refiner = Refiner(PolicyEvaluator(fm, problem.cost, problem.budget_bytes), policy_of(fm, start.decisions)[1])
    best, score = refiner.polish(policy_of(fm, start.decisions)[0], time.monotonic() + time_limit_s)
    sim = refiner.evaluator.simulator.run(start, problem.budget_bytes)
    return refiner.plan(best) if score < INFEASIBLE and (not sim.feasible or score < sim.overhead) else start


def train_weights(problems: list[tuple[Trace, int]], profile: str = DEFAULT_PROFILE, *, init: str | None = None,
                  config: TrainConfig | None = None, min_bytes: int = DEFAULT_MIN_BYTES,
                  progress: bool = True) -> tuple[QNet, TrainReport]:
    """Train one network on several (trace, budget) problems in turn (`memplan dqn train`).

    Args:
        problems: (trace, budget in bytes) pairs; each budget must be at least its trace's floor.
        profile: the cost model's device profile.
        init: weights file to start from (default: a fresh network seeded with config.seed).
        config: Alg. 1's hyper-parameters (default: TrainConfig()).
        min_bytes: smallest activation the agent may act on.
        progress: show a progress bar on a terminal.
    Returns:
        The trained network and the report (best outcome per problem, history).
    Raises:
        InfeasibleBudgetError: a budget below its trace's floor, or at its peak (nothing to learn).
        NeedsOpsError: a trace without ops (a minimalloc pool problem).
    """
    from .net import load_weights
    from .train import Instance, TrainConfig, train

    instances = []
    for trace, budget in problems:
        _check_has_ops(trace)
        if budget >= trace.peak_load_bytes:
            raise MemplanError(f"budget {budget} is at or above the peak {trace.peak_load_bytes} of "
                               f"{trace.meta.get('model', 'a trace')}: nothing to learn there")
        graph = _graph(Problem(trace, cost_of(trace, profile), int(budget)), min_bytes, "dqn")
        instances.append(Instance(graph=graph, env=Env(graph)))
    net = load_weights(init)[0] if init is not None else fresh_network((config or TrainConfig()).seed)
    return net, train(net, instances, config or TrainConfig(), progress=progress)


def default_budgets(trace: Trace, cost: Cost, min_bytes: int = DEFAULT_MIN_BYTES) -> list[int]:
    """The budgets `memplan dqn train` learns at when none are given: TRAIN_POINTS of the way
    from the lowest load the agent can reach (every candidate away) up to the peak, so every
    one is feasible whatever share of the peak the parameters and optimizer state take.

    Raises:
        NeedsOpsError: a trace without ops; MemplanError: nothing can leave memory at the peak.
    """
    _check_has_ops(trace)
    peak = trace.peak_load_bytes
    floor = floor_bytes(build_graph(trace, cost, peak, min_bytes))
    if floor >= peak:
        raise MemplanError(f"{trace.meta.get('model', 'this trace')}: no activation of at least "
                           f"{format_bytes(min_bytes)} is away at the peak, so there is nothing to learn "
                           f"(a smaller --min-bytes lets smaller ones count)")
    return [floor + int((peak - floor) * point) for point in TRAIN_POINTS]


def _check_has_ops(trace: Trace) -> None:
    if not trace.ops:
        raise refuse_without_ops(get_planner("dqn"))


def _graph(problem: Problem, min_bytes: int, name: str) -> Graph | None:
    """The graph to plan on; None when everything fits already.

    Raises:
        InfeasibleBudgetError: below the floor (every candidate away for its whole gap).
    """
    budget_bytes = problem.budget_bytes
    if budget_bytes >= problem.trace.peak_load_bytes:
        return None
    graph = build_graph(problem.trace, problem.cost, budget_bytes, min_bytes)
    floor = floor_bytes(graph)
    if budget_bytes < floor:
        raise infeasible(budget_bytes, floor, name)
    return graph


def floor_bytes(graph: Graph) -> int:
    """The lowest peak the agent can reach: every candidate away from its last forward access to its first
    backward one."""
    return int(load_without(graph.trace, _widest(graph)).max())


def _widest(graph: Graph) -> list[tuple[int, int, int]]:
    return [(g.storage, g.last_forward, g.back_before) for g in graph.gaps]


def _network(weights: str | None, seed: int, required: bool) -> tuple[QNet, bool]:
    """(the network, whether it came from a file): `weights`, else the shipped file, else a fresh seeded one."""
    from .net import load_weights

    if weights == FRESH and not required:
        return fresh_network(seed), False
    path = Path(weights) if weights is not None else SHIPPED_WEIGHTS
    if weights is not None or path.exists():
        return load_weights(path)[0], True
    if required:
        raise MemplanError("dqn:pretrained: no weights shipped with this memplan; pass --param weights=FILE "
                           "(train one with `memplan dqn train`)")
    return fresh_network(seed), False


def fresh_network(seed: int) -> QNet:
    """A newly initialised network, the same for the same seed."""
    import torch

    from .net import QNet

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return QNet()


def _greedy_fitting(net: QNet, graph: Graph, sim: Simulator) -> list[Outcome]:
    """The greedy outcomes against the budget and against limits SLACKS below it (slack leaves room for
    copies in flight), each redone against a lower limit while the simulator finds it short."""
    from .train import Instance, greedy

    out = []
    for slack in SLACKS:
        target = int(graph.budget_bytes * (1.0 - slack))
        if slack and target < floor_bytes(graph):
            break
        for _ in range(RETRIES):
            outcome = greedy(net, Instance(graph=graph, env=Env(graph, target, sim)))
            if outcome.feasible:
                out.append(outcome)
            if outcome.feasible or not outcome.shortfall_bytes:
                break
            target -= outcome.shortfall_bytes
    return out


def _best_or_floor(graph: Graph, outcomes: list[Outcome]) -> Plan:
    if outcomes:
        return min(outcomes, key=lambda o: o.overhead).plan
    log.warning("dqn: the policy found no plan within %d bytes; swapping every candidate instead", graph.budget_bytes)
    return Plan(decisions=gap_decisions(graph.trace, _widest(graph), [], cap=graph.budget_bytes))
