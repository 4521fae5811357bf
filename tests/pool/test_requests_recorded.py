"""The allocation requests of real planned steps on the CPU (recorded by torch.profiler, each with the
op the runner was at) find every slot of the plan's pool on the host replay allocator, and its
blocks never overlap while live (an independent oracle sees every address)."""

from __future__ import annotations

import os

import pytest
import torch

from memplan.pool.replay_allocator import ReplayAllocator
from memplan.pool.requests import step_requests
from memplan.testing.requests import record_cpu_requests, replay_requests
from memplan.workflows.optimize import optimize
from memplan.zoo import get_workload

SMALL = {"num_layers": 2, "d_model": 64, "seq_len": 32, "vocab_size": 100}  # a small transformer-encoder


@pytest.fixture(scope="module")
def host_alloc(tmp_path_factory):
    os.environ["MEMPLAN_CACHE_DIR"] = str(tmp_path_factory.getbasetemp() / "memplan-cache")
    return ReplayAllocator("host")


class Live:
    """Independent oracle: blocks handed out and still live never overlap."""

    def __init__(self):
        self.blocks = {}

    def __call__(self, address, size, alive):
        if not alive:
            del self.blocks[address]
            return
        assert all(address + size <= a or a + s <= address for a, s in self.blocks.items()), (address, size)
        self.blocks[address] = size


@pytest.mark.parametrize("planner, budget, params", [
    ("smartpool", None, {"time_limit_s": 0.5}),
    ("autoswap:doa+smartpool", "80%", {"pool_time_limit_s": 0.5, "min_bytes": 4096}),
])
def test_a_real_steps_requests_find_every_planned_slot(host_alloc, planner, budget, params):
    torch.manual_seed(0)
    w = get_workload("transformer-encoder", 4, **SMALL)
    # interpreted, as a pooled run is (memplan.workflows.run): the pool matches requests by the op clock
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, planner=planner, budget=budget,
                    measure=False, executor="interpreted", **params)
    try:
        plan = step_requests(step.trace, step.program, step.plan.pool)
        step(*w.make_inputs(4, seed=1))  # a first step: the allocator's caches settle
        requests = record_cpu_requests(step, w.make_inputs(4, seed=2))
        swapped = step.stats()["swapped_out"]
    finally:
        step.close()
    assert len(plan.sizes) > 20 and any(r.size > 0 for r in requests)
    assert swapped > 0 or planner == "smartpool"  # prefetched storages request their slots again
    stats = replay_requests(host_alloc, plan, requests, check=Live())
    assert stats["served"] == len(plan.sizes) and stats["served_bytes"] == int(plan.sizes.sum())
    assert stats["missed_slots"] == 0  # (a conflict is a request the trace does not know, refused a slot in use)
    assert stats["served"] + stats["small"] + stats["fallbacks"] == stats["requests"] and stats["live_bytes"] == 0
