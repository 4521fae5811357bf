"""Workspace Division (paper 003 §III-C): one workspace budget shared by all kernels.

Per kernel, the desirable configurations are its Pareto front in (time, workspace): a
configuration is kept only if no other one is at least as fast with at most as much
workspace. The front's points are exactly WR's answers under the limits worth trying,
the workspace values some option has (plus the accumulator for splits): between two such
values nothing new fits. Then a 0-1 integer program picks one configuration per kernel:

    minimise  sum_k sum_c t[k,c] x[k,c]
    such that sum_k sum_c w[k,c] x[k,c] <= limit,  sum_c x[k,c] = 1 for every k,  x binary,

solved with scipy.optimize.milp (HiGHS). The pruning keeps the optimum (the paper's proof):
replacing an undesirable choice by the configuration that dominates it is feasible and no slower.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from ..errors import MemplanError
from .options import Config, Option
from .wr import configs_at


def pareto_front(options: dict[int, list[Option]], batch: int, accumulator: int = 0) -> list[Config]:
    """The desirable configurations of one kernel, by increasing memory (workspace plus accumulator).

    Args:
        options: per benchmarked micro-batch size, the algorithms' options (with `batch`).
        batch: the kernel's batch.
        accumulator: bytes a split of this kernel holds besides its workspace.
    """
    ws = np.unique([o.workspace_bytes for opts in options.values() for o in opts])
    limits = np.unique(np.concatenate([ws, ws + accumulator]))
    return prune([c for c in configs_at(options, batch, limits, accumulator) if c is not None])


def prune(configs: list[Config]) -> list[Config]:
    """The configurations no other one dominates (as fast or faster with as little or less
    memory), one per distinct point, by increasing memory."""
    ordered = sorted(configs, key=lambda c: (c.memory_bytes, c.time_s, len(c.sizes)))
    front: list[Config] = []
    for c in ordered:
        if not front or c.time_s < front[-1].time_s:
            front.append(c)
    return front


def solve(fronts: list[list[Config]], limit: int) -> list[int]:
    """The 0-1 ILP: one configuration per kernel, total memory within `limit`, least total time.

    Args:
        fronts: per kernel, its candidate configurations (its Pareto front, or any list).
        limit: the total workspace in bytes.
    Returns:
        Per kernel, the index of the chosen configuration.
    Raises:
        MemplanError: even the smallest configurations exceed the limit.
    """
    if not fronts:  # no kernels: nothing to choose (HiGHS refuses an empty problem)
        return []
    need = sum(min(c.memory_bytes for c in f) for f in fronts)
    if need > limit:
        raise MemplanError(f"a total workspace of {limit} bytes is below the {need} bytes the kernels need at least")
    sizes = [len(f) for f in fronts]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    times = np.array([c.time_s for f in fronts for c in f])
    memory = np.array([float(c.memory_bytes) for f in fronts for c in f])
    pick = np.zeros((len(fronts), len(times)))
    for k in range(len(fronts)):
        pick[k, starts[k]:starts[k + 1]] = 1.0
    # Times in milliseconds and memory in MiB keep HiGHS's tolerances meaningful.
    scale_t, scale_m = 1e3, 2.0 ** -20
    result = milp(times * scale_t, integrality=np.ones(len(times)), bounds=Bounds(0, 1),
                  constraints=[LinearConstraint(pick, 1, 1), LinearConstraint(memory * scale_m, -np.inf, limit * scale_m)])
    if result.x is None:
        raise MemplanError(f"the workspace division problem has no solution: {result.message}")
    x = np.round(result.x).astype(int)
    return [int(np.argmax(x[starts[k]:starts[k + 1]])) for k in range(len(fronts))]
