"""`memplan fit`: will MODEL train on N x DEVICE, at which batch per rank, with which planner?

For each planner, the largest batch per rank whose rank-0 trace (fake tensors, fake process
group: `memplan.workflows.distributed.trace_rank`) the planner fits in the device's memory, with
the plan simulating within it; batches are probed by doubling, then bisection (as `maxbatch`).
At that batch: the predicted iteration time (the plan's simulated compute time plus the
communication the compute does not hide, from `memplan.sim.comm`), the throughput of the whole
job, and the rank's memory at its unplanned peak by role. Traces are shared by the planners.
"""

from __future__ import annotations

import logging

from ..cost.profiles import get_profile
from ..errors import InfeasibleBudgetError, MemplanError
from ..planners.base import get_planner
from ..planners.base import plan as make_plan
from ..sim.comm import simulate_comm
from ..zoo.registry import check_model_name
from .distributed import check_engine, check_world_size, trace_rank
from .maxbatch import search

log = logging.getLogger(__name__)

DEFAULT_PLANNERS = ("none", "checkpoint-all", "sqrt-n", "save-on-cpu")
DEFAULT_LIMIT = 1 << 12
# Roles of the per-rank breakdown: trace kinds, and the engine's own buffers apart.
ROLES = {"param": "parameters", "grad": "gradients", "optimizer_state": "optimizer_state",
         "activation": "activations", "input": "inputs", "temp": "temporaries", "workspace": "temporaries"}
COMM_ROLE = "communication_buffers"


def breakdown_at_peak(trace) -> dict[str, int]:
    """Bytes alive at the trace's peak op by role (engine-owned storages as communication buffers)."""
    out = dict.fromkeys([*dict.fromkeys(ROLES.values()), COMM_ROLE], 0)
    op = trace.peak_op
    for s in trace.storages:
        if s.alloc_op <= op < s.free_op:
            role = COMM_ROLE if s.id in trace.engine_owned else ROLES[s.kind]
            out[role] += s.nbytes
    return out


def fit(name: str, world_size: int, profile: str, *, engine: str = "fsdp", planners=DEFAULT_PLANNERS,
        limit: int = DEFAULT_LIMIT, **config) -> dict:
    """The largest batch per rank for each planner, with time, throughput and memory (see the module).

    Args:
        name: zoo model name (hf:, tv:, module:function included).
        world_size: ranks (GPUs) in the job.
        profile: the device profile (its memory is the cap; its links price the collectives).
        engine: "fsdp" or "ddp".
        planners: planner names.
        limit: largest batch per rank tried.
        config: model options.
    Returns:
        {"model", "world_size", "profile", "engine", "memory_bytes", "limit", "planners": [{"planner",
        "max_batch", "at_limit", "iteration_s", "samples_per_s", "peak_bytes", "memory"}]}; a
        planner that fits not even batch 1 has max_batch 0 and no figures; "at_limit": the
        limit fits (larger batches were not tried).
    """
    check_engine(engine)
    check_world_size(world_size)
    planners = check_planners(planners)
    profile = get_profile(profile)
    check_model_name(name)
    traces: dict[int, object] = {}

    def traced(batch: int):
        if batch not in traces:
            traces[batch] = trace_rank(name, batch, engine, world_size, **config)
        return traces[batch]

    rows = [_fit_one(planner, traced, profile, world_size, limit) for planner in planners]
    return {"model": name, "world_size": world_size, "profile": profile.name, "engine": engine,
            "memory_bytes": int(profile.memory_bytes), "limit": limit, "planners": rows}


def _fit_one(planner: str, traced, profile, world_size: int, limit: int) -> dict:
    plans: dict[int, object] = {}

    def fits(batch: int) -> bool:
        try:
            made = make_plan(traced(batch), int(profile.memory_bytes), planner=planner, profile=profile)
        except InfeasibleBudgetError:
            return False
        predicted = made.predicted or {}
        ok = predicted.get("feasible", True) and predicted.get("peak_load_bytes", 0) <= profile.memory_bytes
        if ok:
            plans[batch] = made
        return bool(ok)

    best = search(fits, limit)
    log.info("%s: largest batch per rank %d", planner, best)
    if best == 0:
        return {"planner": planner, "max_batch": 0, "at_limit": False}
    return {"planner": planner, "max_batch": best, "at_limit": best == limit,
            **_figures(traced(best), plans[best], profile, world_size)}


def _figures(trace, made, profile, world_size: int) -> dict:
    predicted = made.predicted or {}
    comm = simulate_comm(trace, profile, world_size=world_size)
    seconds = float(predicted.get("time_s", comm.compute_s)) + comm.exposed_comm_s
    batch = int(trace.meta["batch"])
    return {"iteration_s": seconds, "samples_per_s": batch * world_size / seconds if seconds > 0 else None,
            "exposed_comm_s": comm.exposed_comm_s, "link": comm.link,
            "peak_bytes": int(predicted.get("peak_load_bytes", trace.peak_load_bytes)),
            "memory": breakdown_at_peak(trace)}


def check_planners(names) -> tuple[str, ...]:
    """The planner names, or a MemplanError naming an unknown one (or saying there is none)."""
    if not names:
        raise MemplanError("no planner given (e.g. none,sqrt-n)")
    for n in names:
        get_planner(n)
    return tuple(names)
