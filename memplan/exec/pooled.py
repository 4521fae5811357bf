"""PoolSession: a plan's pool layout served by the replay allocator, one iteration per step.

The allocator (memplan.pool.replay_allocator) is armed for exactly the span of a planned step, on the
stream the step computes on, and disarmed after it: what runs between steps (inputs made for
the next step, the loss read back) is served by its heap and is not the plan's business. The
interpreted runner publishes the op it runs in the allocator's op clock, which is how requests find
their slots (`attach`). Per
step the session records the allocator's counters: requests served at their planned slot,
fallbacks (by cause), slots never requested, the most bytes live, the reserved bytes (the pool
block plus what its heap holds at most) and the seconds spent inside the allocator. The
first step is the verified one: its mismatches, in order, are kept (`report()["first_step"]`).
"""

from __future__ import annotations

import torch

from ..pool.replay_allocator import ReplayAllocator, ReplayPlan

# Counters reported per step as differences over the step.
_COUNTED = ("requests", "served", "served_bytes", "small", "fallbacks", "unplanned", "unplanned_bytes", "conflicts",
            "other_stream", "missed_slots")


class PoolSession:
    """Serve `plan`'s slots from `allocator` during each step.

    Args:
        allocator: the replay allocator (the installed CUDA one, or a host one in tests).
        plan: the step's requests at their offsets (`memplan.pool.requests.step_requests`).
        device: where the steps run (its current stream is the pool's stream).
    """

    def __init__(self, allocator: ReplayAllocator, plan: ReplayPlan, device: torch.device | str = "cuda"):
        self.allocator = allocator
        self.plan = plan
        self.device = torch.device(device)
        allocator.configure(plan)
        self.steps: list[dict] = []  # one record per step
        self._before: dict | None = None

    def attach(self, runtime) -> "PoolSession":
        """Serve `runtime`'s steps (a PlanRuntime): its runner publishes ops to the allocator."""
        runtime.runner.op_clock = self.allocator.op_clock
        runtime.pool = self
        return self

    def begin_step(self) -> None:
        """Arm the allocator for one iteration on the current stream; peaks start again."""
        self.allocator.reset_peaks()
        self._before = self.allocator.stats()
        self.allocator.begin_iteration(self._stream())

    def end_step(self) -> None:
        """Disarm it and record the step's counters."""
        if self._before is None:
            return
        self.allocator.end_iteration()
        after, before, self._before = self.allocator.stats(), self._before, None
        record = {key: after[key] - before[key] for key in _COUNTED}
        heap_peak = after["peak_heap_reserved_bytes"]
        record.update(peak_live_bytes=after["peak_live_bytes"], peak_heap_live_bytes=after["peak_heap_live_bytes"],
                      peak_reserved_bytes=self.plan.pool_bytes + max(heap_peak, 0),
                      allocator_s=(after["alloc_ns"] + after["free_ns"] - before["alloc_ns"] - before["free_ns"]) / 1e9)
        self.steps.append(record)

    def report(self) -> dict:
        """JSON-ready: the pool's size, its slots, the steps' records and the verified step's mismatches."""
        first = self.steps[0] if self.steps else {}
        return {"pool_bytes": self.plan.pool_bytes, "slots": len(self.plan.sizes),
                "planned_bytes": int(self.plan.sizes.sum()), "steps": list(self.steps),
                "first_step": {"mismatches": first.get("fallbacks", 0) + first.get("missed_slots", 0),
                               "log": [self._named(m) for m in self.allocator.misses()]},
                "outside_requests": self.allocator.stats()["outside"]}

    def _named(self, miss: dict) -> dict:
        """A mismatch with the trace storage of the slot it concerns (None for a request)."""
        slot, storages = miss["slot"], self.plan.storages
        known = storages is not None and 0 <= slot < len(storages)
        return {**miss, "storage": int(storages[slot]) if known else None}

    def _stream(self) -> int:
        if self.device.type != "cuda":
            return 0
        return int(torch.cuda.current_stream(self.device).cuda_stream)
