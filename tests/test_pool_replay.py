"""The C replay allocator on its host backend: planned hits, fallbacks, no live overlap."""

from __future__ import annotations

import numpy as np
import pytest

from memplan.pool.replay import ReplayAllocator, ReplayPlan


@pytest.fixture()
def alloc(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MEMPLAN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "memplan-cache"))
    return ReplayAllocator("host")


def plan3():
    # Request 0 (64 B) and 1 (32 B) overlap; request 2 (64 B) reuses offset 0 after 0 is freed.
    return ReplayPlan(pool_bytes=96, sizes=np.array([64, 32, 64]), offsets=np.array([0, 64, 0]))


class LiveRanges:
    """Independent oracle: addresses handed out and still live never overlap."""

    def __init__(self):
        self.live = {}

    def add(self, addr, size):
        for a, s in self.live.items():
            assert not (addr < a + s and a < addr + size), (addr, size, a, s)
        self.live[addr] = size

    def remove(self, addr):
        del self.live[addr]


def test_planned_hits_follow_offsets(alloc):
    alloc.configure(plan3())
    base = alloc.pool_base
    a = alloc.malloc(64)
    b = alloc.malloc(32)
    assert (a - base, b - base) == (0, 64)
    alloc.free(a, 64)
    c = alloc.malloc(64)
    assert c - base == 0
    s = alloc.stats()
    assert s["planned_hits"] == 3 and s["fallbacks"] == 0 and s["peak_live_bytes"] == 96


def test_size_mismatch_and_extra_requests_fall_back(alloc):
    alloc.configure(plan3())
    base = alloc.pool_base
    a = alloc.malloc(100)  # plan says 64
    assert not base <= a < base + 96
    b = alloc.malloc(32)
    alloc.free(a, 100)
    c = alloc.malloc(64)
    d = alloc.malloc(8)  # a 4th request: more than planned
    s = alloc.stats()
    assert s["size_mismatches"] == 1 and s["extra_requests"] == 1 and s["planned_hits"] == 2
    assert s["fallbacks"] == 2 and s["peak_reserved_bytes"] >= 96 + 100
    for addr, size in ((b, 32), (c, 64), (d, 8)):
        alloc.free(addr, size)
    assert alloc.stats()["live_bytes"] == 0


def test_live_buffer_blocks_its_planned_range(alloc):
    alloc.configure(plan3())
    oracle = LiveRanges()
    a = alloc.malloc(64)
    oracle.add(a, 64)
    b = alloc.malloc(32)
    oracle.add(b, 32)
    c = alloc.malloc(64)  # planned at offset 0, but request 0 is still live -> fallback
    oracle.add(c, 64)
    assert alloc.stats()["overlap_conflicts"] == 1


def test_iteration_restart_replays_again(alloc):
    alloc.configure(plan3())
    base = alloc.pool_base
    for _ in range(3):
        alloc.new_iteration()
        a = alloc.malloc(64)
        b = alloc.malloc(32)
        alloc.free(a, 64)
        c = alloc.malloc(64)
        assert [x - base for x in (a, b, c)] == [0, 64, 0]
        alloc.free(b, 32)
        alloc.free(c, 64)
    s = alloc.stats()
    assert s["planned_hits"] == 9 and s["fallbacks"] == 0 and s["iterations"] == 3


def test_random_shuffled_sequence_never_overlaps_live(alloc):
    import memplan.pool as mp

    rng = np.random.default_rng(0)
    n = 60
    starts = rng.integers(0, 40, n)
    ends = starts + rng.integers(1, 15, n)
    sizes = rng.integers(1, 50, n) * 16
    result = mp.solve(mp.make_problem(starts, ends, sizes), "smartpool-bestfit")
    alloc.configure(ReplayPlan.from_result(result))
    p = result.problem
    oracle = LiveRanges()
    # Replay with perturbed sizes and lifetimes that drift from the plan.
    drift = rng.integers(0, 3, n)
    events = sorted([(int(p.starts[i]), 1, i) for i in range(n)] + [(int(p.ends[i] + drift[i]), 0, i) for i in range(n)])
    addr = {}
    for _, is_alloc, i in events:
        size = int(p.sizes[i]) + (8 if i % 7 == 0 else 0)
        if is_alloc:
            addr[i] = alloc.malloc(size)
            oracle.add(addr[i], size)
        else:
            oracle.remove(addr[i])
            alloc.free(addr[i], size)
    s = alloc.stats()
    assert s["planned_hits"] + s["fallbacks"] == n and s["size_mismatches"] >= 1 and s["live_bytes"] == 0


@pytest.mark.gpu
def test_cuda_mem_pool_runs_resnet_steps():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    alloc = ReplayAllocator("cuda")
    alloc.configure(ReplayPlan(pool_bytes=1 << 20, sizes=np.array([4096]), offsets=np.array([0])))
    pool = alloc.mem_pool()
    with torch.cuda.use_mem_pool(pool):
        alloc.new_iteration()
        x = torch.ones(1024, device="cuda")
        assert float(x.sum()) == 1024.0
    assert alloc.stats()["planned_hits"] + alloc.stats()["fallbacks"] >= 1
