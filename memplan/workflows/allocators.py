"""Which CUDA allocator serves a run: PyTorch's caching allocator, the same with expandable
segments, or the plan's pool (SmartPool's layout served by memplan's replay allocator).

The choice is made before the run's first CUDA allocation: a pluggable allocator can only
replace PyTorch's before that (memplan.pool.replay says why it must be one). `auto` picks the
pool for a plan that has a layout (a planner that decides "pool": smartpool, X+smartpool) on
CUDA, and otherwise expandable segments, whose reserved memory stays close to what is
allocated (a plan's budget then holds in reserved bytes too), unless PYTORCH_CUDA_ALLOC_CONF
configures the caching allocator itself. Torch has no memory counters for a pluggable
allocator, so a pooled run's reserved bytes are the pool's own (`PoolSession`).
"""

from __future__ import annotations

import os

import torch

from ..errors import MemplanError
from ..exec.pooled import PoolSession
from ..planners.base import get_planner
from ..pool.replay import install_cuda_allocator, installed_cuda_allocator
from ..pool.requests import step_requests

ALLOCATORS = ("auto", "caching", "expandable", "pool")
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"  # a user's own allocator settings: `auto` leaves them alone


def choose_allocator(name: str, *, planner: str, device, baseline: str | None = None) -> str:
    """The allocator a run uses: "caching", "expandable" or "pool".

    Raises:
        MemplanError: an unknown name, or one that cannot serve this run.
    """
    if name not in ALLOCATORS:
        raise MemplanError(f"unknown allocator {name!r}; known: {', '.join(ALLOCATORS)}")
    cuda = torch.device(device).type == "cuda"
    if name == "auto":
        if cuda and not baseline and "pool" in get_planner(planner).decides:
            return "pool"
        return "expandable" if cuda and ALLOC_CONF not in os.environ else "caching"
    if name != "caching" and not cuda:
        raise MemplanError(f"--allocator {name} replaces PyTorch's CUDA allocator: it needs --device cuda")
    if name == "pool" and baseline:
        raise MemplanError(f"--allocator pool serves a plan's layout; --baseline {baseline} runs no plan")
    if name == "pool" and "pool" not in get_planner(planner).decides:
        raise MemplanError(f"--allocator pool needs a plan with a pool layout; planner {planner!r} lays out none "
                           f"(try {planner}+smartpool or smartpool)")
    return name


def install_allocator(mode: str) -> None:
    """Put allocator `mode` in place for this process (before its first CUDA allocation).

    "expandable" sets PyTorch's `expandable_segments:True` for the rest of the process, as
    PYTORCH_CUDA_ALLOC_CONF would; "pool" makes the replay allocator PyTorch's CUDA allocator.
    """
    if mode == "expandable":
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    elif mode == "pool":
        install_cuda_allocator()


def attach_pool(step) -> PoolSession:
    """Serve the layout of an OptimizedStep's plan from the installed pool allocator, step by step."""
    allocator = installed_cuda_allocator()
    if allocator is None:
        raise MemplanError("the pool allocator is not installed in this process")
    session = PoolSession(allocator, step_requests(step.trace, step.program, step.plan.pool), step.runtime.device)
    return session.attach(step.runtime)


def allocator_report(mode: str, session: PoolSession | None, records: list[dict]) -> dict:
    """`allocator` and `pool` for a run's JSON; a pooled run's step records get the pool's
    reserved bytes (`measured_peak_reserved_bytes`), which torch cannot count for it."""
    if session is None:
        return {"allocator": mode, "pool": None}
    for record, pooled in zip(records, session.steps):
        record["measured_peak_reserved_bytes"] = pooled["peak_reserved_bytes"]
    return {"allocator": mode, "pool": session.report()}
