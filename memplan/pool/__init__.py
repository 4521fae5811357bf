"""memplan.pool: offline pool layout (SmartPool), online allocator simulators, replay allocator.

Python API:
    layout(trace, plan=None, allocator="smartpool", time_limit_s=10.0, seed=0) -> PoolResult
    with_pool(trace, plan, ...) -> Plan with `pool` and `pool_bytes` filled
    solve(problem, allocator, ...) -> PoolResult for a PoolProblem (e.g. a minimalloc CSV)
"""

from .allocators.base import known_allocators
from .api import PoolResult, layout, solve, with_pool
from .problem import PoolProblem, make_problem, read_minimalloc_csv

__all__ = ["PoolResult", "PoolProblem", "known_allocators", "layout", "make_problem", "read_minimalloc_csv",
           "solve", "with_pool"]
