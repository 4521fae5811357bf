"""Residency intervals of a trace under a swap/recompute plan: the buffers a pool must hold.

They come from the plan's step program (memplan.sim.program), the one timing model the
simulator and the executor share: a swapped-out storage's memory is free from the point
the program releases it (its device-to-host copy has completed, or an allocation waited
for it), a prefetch or a recomputation allocates at its op, a recomputed storage is
dropped right after its last access before the gap.
"""

from __future__ import annotations

from ..cost.model import Cost
from ..model import Plan, Trace
from ..problem import Problem, cost_of
from ..sim.kernel_loader import for_one_run
from ..sim.program import compile_program, residencies
from ..sim.simulate import Simulator
from .problem import ROLE_OFFLOAD, ROLE_PLAIN, ROLE_PREFETCH, PoolProblem, make_problem

_ROLES = {"plain": ROLE_PLAIN, "offload": ROLE_OFFLOAD, "fetched": ROLE_PREFETCH}


def residency_problem(trace: Trace, plan: Plan | None = None, cost: Cost | None = None) -> PoolProblem:
    """The pool problem of `trace`, under `plan` when given.

    Args:
        trace: the traced iteration.
        plan: swap/recompute decisions (compiled under their own budget); None means every
            storage lives [alloc_op, free_op).
        cost: the cost model the program is compiled with (default: the h100 roofline).
    Returns:
        A PoolProblem with one buffer per non-empty residency interval; roles mark the
        residencies that end in a swap-out (ROLE_OFFLOAD) or start with a prefetch or
        recompute (ROLE_PREFETCH).
    """
    if plan is None or not plan.decisions:
        rows = [(s.id, s.alloc_op, s.free_op, "plain") for s in trace.storages
                if s.nbytes > 0 and s.free_op > s.alloc_op]
    else:
        cost = cost_of(trace, cost=cost)
        # One simulation: interpreted, unless this process has loaded the compiled kernel
        # (memplan.sim.kernel_loader).
        simulator = Simulator(trace, cost, for_one_run())
        rows = residencies(trace, compile_program(Problem(trace, cost), plan, simulator=simulator))
    sids = [r[0] for r in rows]
    return make_problem([r[1] for r in rows], [r[2] for r in rows], [int(trace.nbytes[s]) for s in sids],
                        storages=sids, names=[str(s) for s in sids], roles=[_ROLES[r[3]] for r in rows],
                        source=str(trace.meta.get("model", "")))
