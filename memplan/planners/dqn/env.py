"""The environment of paper 002 §4.5-4.8, stepping incrementally on the simulator's semantics.

The agent stands at a node c (op c has started: its outputs are allocated, its start time
is known) and picks one valid action; each action applies right after op c:

- offload gap k: the activation is copied to the host on the device-to-host engine (FIFO)
  and its memory is released when the copy completes; it is prefetched in backward in the
  order of §4.5 (`memplan.planners.kit.prefetch.prefetch_triggers`).
- remove gap k: it is dropped at once and recomputed before its first backward use.
- nothing (node 0).

Transitions (§4.6). The agent moves on by one node, or after an offload by the time the
offload takes, measured from the start of node c and rounded up to the next node that
starts at or after it ("the agent will be in the 5th node"). When memory is full the
next op waits for the copy to release memory, starts later, and the agent lands there
(the "4th node" exception of Fig. 4). Ops are simulated one at a time with the
simulator's rules (allocation waits for swap-outs in flight, FIFO completions, lazy
release), never the whole iteration per action. Two rules of ours keep episodes
feasible: when doing nothing now would leave a later op over the limit even if every
candidate still open were taken away at the earliest node after this one (the planned
load: every decided gap away from the op after its action), "nothing" is not valid and
the agent stays at c to act again until that is no longer so; and nodes where only
"nothing" is valid are passed without asking the agent.

Terminal (§4.10): when the planned load of every later op is within the limit, nothing
more must be offloaded or removed.

Rewards (§4.7): the episode's plan is simulated once (`memplan.sim.simulate.Simulator`);
each action is charged the time it costs, over the unconstrained iteration time:
a removal its recomputation, an offload the forward wait for its copy and the backward
wait for its prefetch; "nothing" costs 0. The rewards of an episode sum to minus its
simulated overhead. They are known when the episode ends, since an offload's backward
wait depends on the prefetch order of every offload; a failed episode ends with
-FAIL_PENALTY.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np

from ...model import Action, Plan
from ...sim.chains import plan_chains
from ...sim.simulate import Simulator
from ..kit.ledger import Ledger, Removal
from ..kit.prefetch import gap_decisions
from .graph import NOTHING_NODE, Graph

FAIL_PENALTY = 2.0  # the reward of an episode that cannot fit: worse than a 200% overhead
_EPS_S = 1e-12  # seconds below which a wait is float noise


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One finished episode."""

    feasible: bool  # the plan fits and the simulator agrees
    plan: Plan | None  # the plan (None when the episode failed before the end)
    overhead: float  # simulated overhead (inf when infeasible)
    rewards: np.ndarray  # per transition, in order
    reason: str = ""  # why it failed
    shortfall_bytes: int = 0  # for a plan the simulator found infeasible: the bytes missing


class Env:
    """One episode at a time on one graph."""

    def __init__(self, graph: Graph, target_bytes: int | None = None, simulator: Simulator | None = None):
        """Args:
            graph: the graph (trace, cost, budget).
            target_bytes: the limit the planned load must keep (default: the budget); the
                simulator always caps at the budget.
            simulator: a Simulator for this trace and cost, to share between environments.
        """
        trace = graph.trace
        self.graph = graph
        self.budget = graph.budget_bytes
        self.target = graph.budget_bytes if target_bytes is None else target_bytes
        self.sim = simulator or Simulator(trace, graph.cost)
        n = len(trace.ops)
        alive = trace.free_ops > trace.alloc_ops
        self._births = np.bincount(trace.alloc_ops[alive], weights=trace.nbytes[alive], minlength=n).astype(np.int64)
        self._deaths = np.bincount(trace.free_ops[alive] - 1, weights=trace.nbytes[alive], minlength=n).astype(np.int64)
        self._dur = graph.cost.durations
        self._d2h = np.array([graph.cost.d2h_s(g.nbytes) for g in graph.gaps])
        self._producers = np.array([-1 if trace.producer(s) is None else trace.producer(s)
                                    for s in range(len(trace.storages))], dtype=np.int64)
        self.reset()

    # --- the agent's view ---------------------------------------------------------------------

    def reset(self) -> None:
        """Start a new episode at op 0 (and pass the nodes where there is nothing to decide)."""
        self.c, self.t, self.load, self.d2h_free = -1, 0.0, 0, 0.0
        self.pending: collections.deque = collections.deque()  # (release time, bytes) of swap-outs in flight
        self.op_start = np.zeros(len(self.graph.trace.ops))
        self.ledger = Ledger(self.graph.trace, self.graph.gaps, self.target)
        self.d2h_done = np.zeros(len(self.graph.gaps))  # when each offload's copy completes
        self._here: list[int] = []  # gaps decided at the current node
        self.transitions: list[int] = []  # the gap each transition decided (-1: nothing)
        self.done, self.failed, self.reason = False, False, ""
        self._mask: np.ndarray | None = None
        self._removals: dict[int, Removal | None] = {}
        self._advance(-np.inf, finish_current=False)

    def valid_mask(self) -> np.ndarray:
        """Per node: whether its action is valid now (node 0: doing nothing)."""
        if self._mask is None:
            self._mask = self._compute_mask()
        return self._mask

    def deficit(self) -> int:
        """Bytes still to take away: the largest excess of the planned load after this node over the limit."""
        return int(self.ledger.planned[self.c + 1:].max(initial=0)) - self.target

    def features(self) -> np.ndarray:
        """The node features of the current state (`Graph.state_features`)."""
        return self.graph.state_features(self.c, self.valid_mask(), self.deficit())

    def step(self, node: int) -> bool:
        """Take the action of `node` (valid now) at the current node; returns True when the episode is over."""
        if self.done:
            raise RuntimeError("step after the end of the episode")
        if not self.valid_mask()[node]:
            raise ValueError(f"node {node} is not a valid action at node {self.c}")
        k = int(self.graph.node_gap[node]) if node != NOTHING_NODE else -1
        self.transitions.append(k)
        if k < 0:
            self._advance(-np.inf)
            return self.done
        offload = self.graph.node_kind[node] == Action.SWAP
        if offload:
            self.ledger.offload(k, self.c)
        else:
            self.ledger.remove(self._removals[k], self.c)
        self._here.append(k)
        self._mask, self._removals = None, {}
        if self.ledger.fits_from(self.c + 1):
            self.done = True
        elif not self._forced():
            self._advance(self.op_start[self.c] + self._d2h[k] if offload else -np.inf)
        else:
            self._check_choice()
        return self.done

    # --- moving along the forward pass ------------------------------------------------------------

    def _advance(self, until_s: float, finish_current: bool = True) -> None:
        """Finish the current op, then start the next ones until the agent lands (see the module doc)."""
        if finish_current:
            self._finish_op(self.c)
        while True:
            self.c += 1
            self._mask, self._removals = None, {}
            if self.c > self.ledger.last_forward:
                return self._fail("the forward pass ended before the load fit")
            if not self._start_op(self.c):
                return self._fail(f"op {self.c} cannot allocate its outputs")
            if self.ledger.fits_from(self.c + 1):
                self.done = True
                return None
            if self._forced() or (self.op_start[self.c] >= until_s and self.valid_mask()[1:].any()):
                return self._check_choice()
            self._finish_op(self.c)

    def _forced(self) -> bool:
        """True when doing nothing now would doom the episode (see the module doc)."""
        return self.ledger.doomed(self.c, earliest=self.c + 1)

    def _check_choice(self) -> None:
        """Fail when the agent has to act here but no action is valid."""
        if not self.valid_mask().any():
            self._fail(f"at op {self.c} the load must shrink but nothing is left to take away")

    def _fail(self, reason: str) -> None:
        self.done, self.failed, self.reason = True, True, reason

    def _start_op(self, i: int) -> bool:
        """The simulator's start of op i: release finished swap-outs, wait for more until its outputs fit."""
        while self.pending and self.pending[0][0] <= self.t:
            self.load -= self.pending.popleft()[1]
        need = int(self._births[i])
        while self.load + need > self.budget and self.pending:
            done_s, nbytes = self.pending.popleft()
            self.t = max(self.t, done_s)
            self.load -= nbytes
        if self.load + need > self.budget:
            return False
        self.load += need
        self.op_start[i] = self.t
        return True

    def _finish_op(self, i: int) -> None:
        """Run op i, release what dies, then drop or start copying the gaps decided at it."""
        self.t += float(self._dur[i])
        self.load -= int(self._deaths[i])
        ledger = self.ledger
        for k in sorted(self._here, key=lambda k: (ledger.back[k], ledger.sid[k])):  # the plan's order
            if ledger.decided[k] == Action.RECOMPUTE:
                self.load -= int(ledger.nbytes[k])
                continue
            self.d2h_free = max(self.t, self.d2h_free) + self._d2h[k]
            self.d2h_done[k] = self.d2h_free
            self.pending.append((self.d2h_free, int(ledger.nbytes[k])))
        self._here = []

    # --- which actions are valid -------------------------------------------------------------------

    def _compute_mask(self) -> np.ndarray:
        g, ledger, c = self.graph, self.ledger, self.c
        mask = np.zeros(g.num_nodes, dtype=bool)
        mask[NOTHING_NODE] = not self._forced()
        for k in ledger.open_at(c):
            if g.offload_node[k] >= 0:
                mask[g.offload_node[k]] = True
            if g.remove_node[k] >= 0 and self._removal(k) is not None:
                mask[g.remove_node[k]] = True
        return mask

    def _removal(self, k: int) -> Removal | None:
        """The removal of gap k now, when its recomputations can run and it does not doom the episode."""
        if k not in self._removals:
            ledger = self.ledger
            effect = ledger.removal(k, self.c)
            if effect is not None and ledger.doomed(self.c, self.c, after=effect):
                effect = None
            self._removals[k] = effect
        return self._removals[k]

    # --- the end of an episode ----------------------------------------------------------------------

    def outcome(self) -> Outcome:
        """Simulate the episode's plan once and charge each transition its cost (see the module doc)."""
        rewards = np.zeros(len(self.transitions))
        if self.failed or not self.done:
            return self._failed(rewards, self.reason or "the episode did not end")
        plan = self.plan()
        sim = self.sim.run(plan, self.budget, timeline=True)
        if not sim.feasible:
            return self._failed(rewards, f"the simulator finds the plan infeasible at op {sim.infeasible_op}",
                                sim.shortfall_bytes, plan)
        blame = self._blame(plan, sim)
        for step, k in enumerate(self.transitions):
            if k >= 0:
                rewards[step] = -blame.get(k, 0.0) / sim.baseline_time_s
        if len(rewards):  # what no action can be charged with (float noise, rare waits) goes to the last
            rewards[-1] -= (sim.time_s - sim.baseline_time_s) / sim.baseline_time_s + rewards.sum()
        return Outcome(feasible=True, plan=plan, overhead=sim.overhead, rewards=rewards)

    def _failed(self, rewards: np.ndarray, reason: str, shortfall: int = 0, plan: Plan | None = None) -> Outcome:
        if len(rewards):
            rewards[-1] = -FAIL_PENALTY
        return Outcome(feasible=False, plan=plan, overhead=float("inf"), rewards=rewards, reason=reason,
                       shortfall_bytes=shortfall)

    def plan(self) -> Plan:
        """The plan of the decisions taken so far (swaps prefetched in the order of §4.5).

        A decision taken at node c is recorded after the activation's last forward access
        (at or before c): the executor acts on a storage only at an op that touches it
        (`memplan.exec.interpreted`). It leaves at most earlier than the agent decided, so the
        load never rises; the plan's rewards come from simulating it as recorded. The
        environment's own clock follows the decisions as taken, so after the first decision
        recorded earlier its op start times can differ from the plan's simulated ones.
        """
        ledger = self.ledger
        return Plan(decisions=gap_decisions(self.graph.trace, self._executable(ledger.triples(Action.SWAP)),
                                            self._executable(ledger.triples(Action.RECOMPUTE)), cap=self.target,
                                            load=ledger.planned))

    def _executable(self, triples: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        gaps, gap_of = self.graph.gaps, self.ledger.gap_of
        return [(s, min(out, gaps[gap_of[s]].last_forward), back) for s, out, back in triples]

    def _blame(self, plan: Plan, sim) -> dict[int, float]:
        """Seconds of waiting and recomputation each decided gap caused, from the simulated timeline."""
        decisions = plan.decisions
        gap = {k: self.ledger.gap_of[d.storage] for k, d in enumerate(decisions)}
        chains = plan_chains(self.graph.trace, decisions, self._dur, self._producers)
        starts = sim.op_start_s
        ends = np.concatenate([[0.0], starts[:-1] + self._dur[:-1]])
        blame: dict[int, float] = collections.defaultdict(float)
        by_back, by_trigger = collections.defaultdict(list), collections.defaultdict(list)
        for k, d in enumerate(decisions):
            if d.action == "recompute":
                blame[gap[k]] += chains[k].seconds
                ends[d.back_before] += chains[k].seconds
            else:
                by_back[d.back_before].append(gap[k])
                by_trigger[d.prefetch_at].append(gap[k])
        swaps = sorted((self.d2h_done[j], j) for j in set(gap.values()) if self.ledger.decided[j] == Action.SWAP)
        for i in np.flatnonzero(starts - ends > _EPS_S):
            self._blame_wait(blame, float(ends[i]), float(starts[i]), swaps, by_back[i] or by_trigger[i])
        return blame

    @staticmethod
    def _blame_wait(blame, begin: float, end: float, swaps, prefetches: list[int]) -> None:
        """Charge the wait [begin, end) before one op: to the swap-outs completing inside it (in
        FIFO order), then what is left to the last prefetch the op needed or issued."""
        cursor = begin
        for done_s, j in swaps:
            if cursor < done_s <= end:
                blame[j] += done_s - cursor
                cursor = done_s
        if end - cursor > _EPS_S and prefetches:
            blame[prefetches[-1]] += end - cursor
