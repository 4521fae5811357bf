"""Which CUDA allocator serves a run: PyTorch's caching allocator, the same with expandable
segments, or the plan's pool (SmartPool's layout served by memplan's replay allocator).

The choice is made before the run's first CUDA allocation: a pluggable allocator can only
replace PyTorch's before that (memplan.pool.replay_allocator says why it must be one). `auto` picks the
pool for a plan that has a layout (a planner that decides "pool": smartpool, X+smartpool) on
CUDA, and otherwise expandable segments, whose reserved memory stays close to what is
allocated (a plan's budget then holds in reserved bytes too), unless PYTORCH_CUDA_ALLOC_CONF
configures the caching allocator itself. Torch has no memory counters for a pluggable
allocator, so a pooled run's reserved bytes are the pool's own (`PoolSession`).

Importing it is light: the command line offers the allocators' names; torch and the pool's
runtime are imported where an allocator is installed or served.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import MemplanError
from ..run_options import AllocatorMode

if TYPE_CHECKING:
    from ..exec.pooled import PoolSession


ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"  # a user's own allocator settings: `auto` leaves them alone
ALLOCATORS = AllocatorMode.names()


def choose_allocator(name: str, *, planner: str, device, baseline: str | None = None) -> AllocatorMode:
    """The allocator a run uses: caching, expandable or pool.

    Raises:
        MemplanError: an unknown name, or one that cannot serve this run.
    """
    from ..planners.base import get_planner

    if name not in ALLOCATORS:
        raise MemplanError(f"unknown allocator {name!r}; known: {', '.join(ALLOCATORS)}")
    mode, cuda = AllocatorMode(name), str(device).split(":")[0] == "cuda"
    pooled_plan = not baseline and "pool" in get_planner(planner).decides
    if mode == AllocatorMode.AUTO:
        if cuda and pooled_plan:
            return AllocatorMode.POOL
        return AllocatorMode.EXPANDABLE if cuda and ALLOC_CONF not in os.environ else AllocatorMode.CACHING
    if mode != AllocatorMode.CACHING and not cuda:
        raise MemplanError(f"--allocator {name} replaces PyTorch's CUDA allocator: it needs --device cuda")
    if mode == AllocatorMode.POOL and baseline:
        raise MemplanError(f"--allocator pool serves a plan's layout; --baseline {baseline} runs no plan")
    if mode == AllocatorMode.POOL and not pooled_plan:
        raise MemplanError(f"--allocator pool needs a plan with a pool layout; planner {planner!r} lays out none "
                           f"(try {planner}+smartpool or smartpool)")
    return mode


def install_allocator(mode: AllocatorMode) -> None:
    """Put allocator `mode` in place for this process (before its first CUDA allocation).

    "expandable" sets PyTorch's `expandable_segments:True` for the rest of the process, as
    PYTORCH_CUDA_ALLOC_CONF would; "pool" makes the replay allocator PyTorch's CUDA allocator.
    """
    if mode == AllocatorMode.EXPANDABLE:
        import torch

        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    elif mode == AllocatorMode.POOL:
        from ..pool.replay_allocator import install_cuda_allocator

        install_cuda_allocator()


def attach_pool(step) -> PoolSession:
    """Serve the layout of an OptimizedStep's plan from the installed pool allocator, step by step."""
    from ..exec.pooled import PoolSession
    from ..pool.replay_allocator import installed_cuda_allocator
    from ..pool.requests import step_requests

    allocator = installed_cuda_allocator()
    if allocator is None:
        raise MemplanError("the pool allocator is not installed in this process")
    session = PoolSession(allocator, step_requests(step.trace, step.program, step.plan.pool), step.runtime.device)
    return session.attach(step.runtime)


def allocator_report(mode: AllocatorMode, session: PoolSession | None, records: list[dict]) -> dict:
    """`allocator` and `pool` for a run's JSON; a pooled run's step records get the pool's
    reserved bytes (`measured_peak_reserved_bytes`), which torch cannot count for it."""
    if session is None:
        return {"allocator": str(mode), "pool": None}
    for record, pooled in zip(records, session.steps):
        record["measured_peak_reserved_bytes"] = pooled["peak_reserved_bytes"]
    return {"allocator": str(mode), "pool": session.report()}
