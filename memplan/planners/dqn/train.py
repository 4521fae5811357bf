"""Fitted Q-iteration (paper 002 Alg. 1, Eq. 4-5) and greedy inference.

Per episode: start at the beginning of the iteration; at every decision the agent takes a
random valid action with probability epsilon, else argmax Q; epsilon falls linearly over
the episodes (Alg. 1 line 7: random when e > episode / l, here scaled by a starting
epsilon, 1 from scratch). After every step one minibatch from the replay buffer D updates
W by Eq. 4 with y = r + gamma max_a' Q(next, a') (Eq. 5; 0 after the terminal state; no
gradient through y), with Adam. An episode's transitions join D when it ends, since the
rewards come from simulating its plan (see `env`). Every `eval_every` episodes a greedy
episode measures the policy; the best plan seen is kept (Fig. 3: "a best-found strategy").
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ...progress import progress_bar
from .env import Env, Outcome
from .graph import Graph
from .net import GraphTensors, QNet

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Hyper-parameters of Alg. 1."""

    episodes: int = 200  # l: episodes (epsilon reaches 0 at the last)
    time_limit_s: float | None = None  # stop earlier when this much wall time has passed
    gamma: float = 0.99  # discount of Eq. 5
    lr: float = 1e-3  # Adam step size
    batch_size: int = 16  # |B|
    update_every: int = 1  # environment steps per minibatch update (Alg. 1: 1)
    replay: int = 20_000  # capacity of D (oldest transitions dropped first)
    epsilon: float = 1.0  # epsilon at the first episode
    eval_every: int = 10  # greedy evaluation every this many episodes (and after the last)
    seed: int = 0  # seeds the exploration and the minibatches


@dataclass
class Instance:
    """One (trace, budget) to train on: its graph, tensors and environment."""

    graph: Graph  # the graph
    env: Env  # its environment
    tensors: GraphTensors = field(init=False)  # its tensors

    def __post_init__(self):
        self.tensors = GraphTensors(self.graph)

    @classmethod
    def of(cls, graph: Graph) -> Instance:
        """An instance with a fresh environment."""
        return cls(graph=graph, env=Env(graph))


@dataclass(frozen=True, kw_only=True)
class State:
    """What the agent sees: the node under execution, the valid actions and the bytes still to save."""

    current: int  # node under execution
    valid: np.ndarray  # valid mask (bool, per node)
    deficit: int  # bytes still to take away


@dataclass(frozen=True, kw_only=True)
class Transition:
    """(state, action, reward, next state) of Alg. 1 line 13."""

    instance: int  # index of the instance
    state: State  # the state
    node: int  # the action's node
    reward: float  # r
    next_state: State  # the next state
    terminal: bool  # the next state is terminal


@dataclass
class TrainReport:
    """What training found and how it went."""

    best: list[Outcome | None]  # per instance: the best feasible outcome seen
    history: list[dict]  # per episode: episode, elapsed_s, epsilon, return, overhead, greedy_overhead
    episodes: int = 0  # episodes run
    steps: int = 0  # environment steps taken
    wall_s: float = 0.0  # wall time of training


@contextlib.contextmanager
def one_thread():
    """Small matrices: one thread is faster than several (and fair on a shared host)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def choose(net: QNet, inst: Instance, state: State, epsilon: float, rng: np.random.Generator) -> int:
    """An epsilon-greedy valid action (a node) in `state`."""
    nodes = np.flatnonzero(state.valid)
    if rng.random() < epsilon:
        return int(rng.choice(nodes))
    with torch.no_grad():
        q = q_all(net, inst, [state])[0]
    return int(nodes[int(torch.argmax(q[nodes]))])


def run_episode(net: QNet, inst: Instance, epsilon: float, rng: np.random.Generator,
                on_step=None) -> tuple[Outcome, list[tuple[State, int]]]:
    """One episode; returns its outcome and the (state, action node) of each step."""
    env = inst.env
    env.reset()
    steps = []
    while not env.done:
        state = State(current=env.c, valid=env.valid_mask().copy(), deficit=env.deficit())
        node = choose(net, inst, state, epsilon, rng)
        env.step(node)
        steps.append((state, node))
        if on_step is not None:
            on_step()
    return env.outcome(), steps


def greedy(net: QNet, inst: Instance) -> Outcome:
    """The greedy policy's outcome (epsilon 0)."""
    with one_thread():
        return run_episode(net, inst, 0.0, np.random.default_rng(0))[0]


class _OutOfTime(Exception):
    """Raised from a training step once the time limit has passed."""


def train(net: QNet, instances: list[Instance], config: TrainConfig, progress: bool = True) -> TrainReport:
    """Alg. 1 over the instances in turn; returns the best outcomes and the history."""
    rng = np.random.default_rng(config.seed)
    optimizer = torch.optim.Adam(net.parameters(), lr=config.lr)
    replay: list[Transition] = []
    report = TrainReport(best=[None] * len(instances), history=[])
    started = time.perf_counter()
    deadline = started + config.time_limit_s if config.time_limit_s is not None else float("inf")

    def update():
        if time.perf_counter() > deadline:  # a long episode on a large graph must not overrun the limit
            raise _OutOfTime
        report.steps += 1
        if len(replay) >= config.batch_size and report.steps % config.update_every == 0:
            fit_step(net, optimizer, [replay[i] for i in rng.choice(len(replay), config.batch_size, replace=False)],
                     instances, config.gamma)

    with one_thread(), progress_bar("dqn", total=config.episodes, unit="episode", enabled=progress) as bar:
        for episode in range(config.episodes):
            if time.perf_counter() > deadline:
                break
            index = episode % len(instances)
            epsilon = config.epsilon * (1.0 - episode / config.episodes)
            try:
                outcome, states = run_episode(net, instances[index], epsilon, rng, on_step=update)
            except _OutOfTime:  # the episode in progress is dropped
                break
            _remember(replay, index, states, outcome, config.replay)
            row = {"episode": episode, "instance": index, "elapsed_s": time.perf_counter() - started,
                   "epsilon": epsilon, "return": float(outcome.rewards.sum()), "overhead": outcome.overhead}
            _keep_best(report.best, index, outcome)
            if (episode + 1) % config.eval_every == 0 or episode + 1 == config.episodes:
                row["greedy_overhead"] = _evaluate(net, instances, report.best)
            report.history.append(row)
            report.episodes = episode + 1
            bar.update(1)
            bar.set_postfix_str(f"eps {epsilon:.2f} return {row['return']:+.3f}")
    report.wall_s = time.perf_counter() - started
    return report


def _evaluate(net: QNet, instances: list[Instance], best: list) -> list[float]:
    """Greedy overhead on every instance (inf where it fails); better plans are kept."""
    out = []
    for index, inst in enumerate(instances):
        outcome = run_episode(net, inst, 0.0, np.random.default_rng(0))[0]
        _keep_best(best, index, outcome)
        out.append(outcome.overhead)
    return out


def _keep_best(best: list, index: int, outcome: Outcome) -> None:
    if outcome.feasible and (best[index] is None or outcome.overhead < best[index].overhead):
        best[index] = outcome


def transitions(index: int, steps: list, outcome: Outcome) -> list[Transition]:
    """An episode's transitions, each with the next step's state as its next state (the last: terminal)."""
    out = []
    for i, (state, node) in enumerate(steps):
        last = i + 1 == len(steps)
        out.append(Transition(instance=index, state=state, node=node, reward=float(outcome.rewards[i]),
                              next_state=state if last else steps[i + 1][0], terminal=last))
    return out


def _remember(replay: list, index: int, steps: list, outcome: Outcome, capacity: int) -> None:
    """Add an episode's transitions to D (the oldest leave when it is full)."""
    replay.extend(transitions(index, steps, outcome))
    del replay[:max(0, len(replay) - capacity)]


def fit_step(net: QNet, optimizer: torch.optim.Optimizer, batch: list[Transition], instances: list[Instance],
             gamma: float) -> float:
    """One SGD step of Eq. 4 on a minibatch; returns the mean squared TD error before the step."""
    loss = td_loss(net, batch, instances, gamma)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def td_loss(net: QNet, batch: list[Transition], instances: list[Instance], gamma: float) -> torch.Tensor:
    """Mean of (y - Q(g, s_a))^2 over the minibatch (Eq. 4), y from Eq. 5 held constant."""
    total = torch.zeros(())
    for index in sorted({t.instance for t in batch}):
        group = [t for t in batch if t.instance == index]
        inst = instances[index]
        q = q_all(net, inst, [t.state for t in group])
        q_taken = q[torch.arange(len(group)), torch.tensor([t.node for t in group])]
        with torch.no_grad():
            valid = torch.as_tensor(np.stack([t.next_state.valid for t in group]))
            q_next = q_all(net, inst, [t.next_state for t in group]).masked_fill(~valid, -torch.inf)
            best_next = q_next.max(dim=1).values
            done = torch.tensor([t.terminal for t in group]) | torch.isinf(best_next)
            y = torch.tensor([t.reward for t in group]) + gamma * torch.where(done, 0.0, best_next)
        total = total + ((y - q_taken) ** 2).sum()
    return total / len(batch)


def q_all(net: QNet, inst: Instance, states: list[State]) -> torch.Tensor:
    """Q of every node as the action in each state: (B, N)."""
    x = np.stack([inst.graph.state_features(s.current, s.valid, s.deficit) for s in states])
    return net.q_values(net.embed(inst.tensors, torch.as_tensor(x)), torch.tensor([s.current for s in states]))
