"""Iteration time of one rank with its collectives on a communication stream beside compute.

As DDP and FSDP2 run them: a collective is issued on its own stream when the compute stream
reaches it in program order (after the op that fills its buffer, e.g. FSDP2's
`all_gather_copy_in` or DDP's bucket copy), the communication stream runs collectives one at
a time in issue order, and the compute stream goes on until an op reads a buffer a collective
writes, which waits for that collective to land. Prefetching is what the trace shows: FSDP2
issues a block's backward all-gather before the previous block's gradient ops, so they
overlap; DDP's bucket all-reduces overlap the backward pass that follows them. The end of the
iteration waits for both streams.

Memory is not modelled here: collective buffers are storages of the trace, and the simulator
counts them like any other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost.model import Cost
from ..cost.network import collective_s, job_link
from ..cost.profiles import DeviceProfile
from ..errors import MemplanError
from ..model import Trace
from ..problem import DEFAULT_PROFILE, cost_of
from ..tracing.collectives import collective_kind, payload_bytes


@dataclass(frozen=True, kw_only=True)
class CommResult:
    """One rank's iteration with communication."""

    world_size: int  # ranks in the job
    link: str  # the link that bounds its collectives
    algorithm: str  # "ring" or "tree"
    iteration_s: float  # both streams done
    compute_s: float  # sum of compute op durations
    comm_s: float  # sum of collective durations on the communication stream
    exposed_comm_s: float  # time compute waited for a collective, plus the tail after compute ended
    collectives: int  # how many ran

    @property
    def overlapped_comm_s(self) -> float:
        """Communication hidden behind compute."""
        return max(self.comm_s - self.exposed_comm_s, 0.0)

    def to_json(self) -> dict:
        """A JSON-ready dict."""
        return {"world_size": self.world_size, "link": self.link, "algorithm": self.algorithm,
                "iteration_s": self.iteration_s, "compute_s": self.compute_s, "comm_s": self.comm_s,
                "exposed_comm_s": self.exposed_comm_s, "overlapped_comm_s": self.overlapped_comm_s,
                "collectives": self.collectives}


def simulate_comm(trace: Trace, profile: str | DeviceProfile = DEFAULT_PROFILE, *, world_size: int | None = None,
                  algorithm: str = "ring", cost: Cost | None = None) -> CommResult:
    """Two-stream timing of one rank's iteration (see the module docstring).

    Args:
        trace: a rank's trace (from `memplan trace --ddp|--fsdp`).
        profile: the cost model's device profile; its `intra_link`, `inter_link` and `gpus_per_node`
            price collectives.
        world_size: ranks in the job (default: the trace's `meta["world_size"]`).
        algorithm: "ring" or "tree".
        cost: op durations (default: the trace's on `profile`).
    Raises:
        MemplanError: no world size given or recorded.
    """
    cost = cost_of(trace, profile, cost)
    n = world_size if world_size is not None else trace.meta.get("world_size")
    if not isinstance(n, int) or n < 1:
        raise MemplanError("the trace records no world size: give one (a trace from memplan trace --ddp|--fsdp)")
    profile = cost.profile
    link = job_link(n, profile.gpus_per_node, profile.intra_link, profile.inter_link)
    ready = np.zeros(len(trace.storages))  # when a collective's output lands, per storage
    now = comm_free = waited = compute = comm = 0.0
    count = 0
    for op in trace.ops:
        start = max(now, max((float(ready[s]) for s in op.reads), default=0.0))
        waited += start - now
        kind = collective_kind(op.name)
        if kind is None:
            seconds = float(cost.durations[op.index])
            now, compute = start + seconds, compute + seconds
            continue
        seconds = collective_s(kind, payload_bytes(trace, op), n, link, algorithm)
        comm_free = max(start, comm_free) + seconds
        ready[list(op.writes)] = comm_free
        now, comm, count = start + profile.launch_s, comm + seconds, count + 1
    end = max(now, comm_free)
    return CommResult(world_size=n, link=link.name, algorithm=algorithm, iteration_s=end, compute_s=compute,
                      comm_s=comm, exposed_comm_s=waited + (end - now), collectives=count)
