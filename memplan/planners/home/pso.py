"""HOME's particle swarm (paper 004 §3.3, §3.5: Algorithms 1 and 3) over policy vectors.

A particle is a policy: one action per feature map. Algorithm 1: particles start random;
every iteration evaluates each particle (Algorithm 2's role, here a score function),
records the best ever, then updates every particle (Algorithm 3): starting from its
current policy, tensor by tensor, it tries the action of the last iteration's best
particle (P1) and of its own historical best (P2), evaluates both, and keeps the one with
the lower overhead (P2 on a tie). Nothing else moves a particle: no velocities, no
mutation.

Three shortcuts leave every result exactly as the algorithm defines it:
- scores are memoized by policy (the evaluator is deterministic), so a policy met again
  costs nothing; where P1 and P2 agree both candidates are one policy, and the tie rule
  keeps it without an evaluation;
- an update is evaluated where it ends (the next iteration's line 7), by the same chunk,
  so its memo holds it;
- an update that changes no particle is a fixed point: every later iteration would repeat
  it exactly, so the search stops there and the remaining iterations are recorded as copies.
The last iteration's update (Algorithm 1 line 13 after the last evaluation) changes
nothing that is returned, and is skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

Score = Callable[[np.ndarray], float]


def update_particle(policy: np.ndarray, p1: np.ndarray, p2: np.ndarray, score: Score,
                    deadline: float = float("inf")) -> np.ndarray:
    """Algorithm 3 for one particle: its new policy.

    Args:
        policy: the particle's current policy (not changed).
        p1: the best policy of the last iteration.
        p2: this particle's historical best.
        score: overhead of a policy (lower is better).
        deadline: `time.monotonic()` after which the remaining tensors keep their actions.
    """
    out = policy.copy()
    for j in range(len(out)):
        if p1[j] == p2[j]:  # one candidate: O1 == O2, and the tie keeps P2[j]
            out[j] = p2[j]
            continue
        if time.monotonic() > deadline:
            break
        out[j] = p1[j]
        o1 = score(out)
        out[j] = p2[j]
        o2 = score(out)
        out[j] = p1[j] if o1 < o2 else p2[j]
    return out


def random_policies(allowed: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` policies, each action drawn uniformly from those allowed per tensor (Algorithm 1 lines 1-3).

    Args:
        allowed: (n, actions) bool.
        count: number of particles.
        rng: the random generator (the only randomness of the search).
    Returns:
        (count, n) int8.
    """
    n, k = allowed.shape
    draws = rng.random((count, n)) * allowed.sum(axis=1)
    ranks = np.floor(draws).astype(np.int64)  # the rank among the allowed actions of each tensor
    order = np.cumsum(allowed, axis=1) - 1  # rank of each allowed action
    out = np.empty((count, n), dtype=np.int8)
    for a in range(k):
        out[allowed[:, a] & (order[:, a] == ranks)] = a
    return out


@dataclass
class Chunk:
    """The particles one worker owns: policies, historical bests and their scores."""

    score: Score  # the (memoized) evaluator
    policies: np.ndarray  # (count, n) int8
    best: np.ndarray = None  # historical best per particle
    best_score: np.ndarray = None  # its score
    scores: np.ndarray = None  # score of the current policies

    def start(self) -> dict:
        """Evaluate the initial policies (Algorithm 1, first pass of lines 6-12)."""
        self.scores = np.array([self.score(p) for p in self.policies])
        self.best, self.best_score = self.policies.copy(), self.scores.copy()
        return self.report(changed=True)

    def step(self, p1: np.ndarray, deadline: float) -> dict:
        """Update every particle (Algorithm 3) and evaluate the results (the next lines 6-12)."""
        changed = False
        for i, policy in enumerate(self.policies):
            new = update_particle(policy, p1, self.best[i], self.score, deadline)
            if np.array_equal(new, policy):
                continue
            changed = True
            self.policies[i] = new
            self.scores[i] = self.score(new)
            if self.scores[i] < self.best_score[i]:
                self.best[i], self.best_score[i] = new, self.scores[i]
        return self.report(changed)

    def report(self, changed: bool) -> dict:
        """What the swarm needs from this chunk after a pass."""
        i = int(np.argmin(self.scores))
        return {"changed": changed, "scores": self.scores.copy(), "best": self.policies[i].copy(),
                "evaluations": getattr(self.score, "evaluations", 0)}


@dataclass
class History:
    """Per iteration: the best score so far, and the iteration's mean and worst (Fig. 8)."""

    best: list = field(default_factory=list)
    mean: list = field(default_factory=list)
    worst: list = field(default_factory=list)
    converged_at: int | None = None  # the iteration from which nothing changed
    evaluations: int = 0  # plans the chunks' evaluators had simulated after the last iteration, together

    def add(self, best: float, scores: np.ndarray, feasible_below: float) -> None:
        """Record one iteration; infeasible scores (>= feasible_below) are left out of mean and worst."""
        ok = scores[scores < feasible_below]
        self.best.append(best)
        self.mean.append(float(ok.mean()) if ok.size else float("nan"))
        self.worst.append(float(ok.max()) if ok.size else float("nan"))


def swarm(chunks, iters: int, feasible_below: float, deadline: float = float("inf"),
          on_iteration: Callable[[int, float], None] | None = None) -> tuple[np.ndarray, float, History]:
    """Algorithm 1 over particles split into chunks (local `Chunk`s or worker proxies).

    Args:
        chunks: objects with `submit(method, *args)` and `collect()` running `Chunk.start()` and
            `Chunk.step(p1, deadline)` (memplan.planners.home.workers); particle order is
            chunk order, then order within a chunk.
        iters: iterations (each evaluates every particle once).
        feasible_below: scores at or above this are infeasible policies.
        deadline: `time.monotonic()` after which no further iteration starts.
        on_iteration: called with (iteration, best score so far) after each.
    Returns:
        (best policy, its score, history).
    """
    history = History()
    best, best_score = None, float("inf")
    reports = _each(chunks, "start")
    for it in range(iters):
        scores = np.concatenate([r["scores"] for r in reports])
        history.evaluations = sum(r["evaluations"] for r in reports)
        lowest = min(range(len(reports)), key=lambda c: (reports[c]["scores"].min(), c))
        p1 = reports[lowest]["best"]
        if scores.min() < best_score:
            best, best_score = p1, float(scores.min())
        history.add(best_score, scores, feasible_below)
        if on_iteration:
            on_iteration(it, best_score)
        if it + 1 == iters or time.monotonic() > deadline:
            break
        reports = _each(chunks, "step", p1, deadline)
        if not any(r["changed"] for r in reports) and time.monotonic() <= deadline:
            history.converged_at = it + 1
            _repeat(history, iters)
            break
    return best, best_score, history


def _each(chunks, method: str, *args) -> list[dict]:
    """Run `method` on every chunk at once (workers in parallel) and collect the reports in order."""
    for c in chunks:
        c.submit(method, *args)
    return [c.collect() for c in chunks]


def _repeat(history: History, iters: int) -> None:
    """A fixed point: the remaining iterations repeat the last one."""
    for series in (history.best, history.mean, history.worst):
        series.extend([series[-1]] * (iters - len(series)))
