"""The collective cost model (memplan.cost.network) and the communication stream (memplan.sim.comm)."""

import math

import pytest

from memplan.cost.network import LINKS, bus_bandwidth, collective_s, job_link
from memplan.cost.profiles import get_profile
from memplan.errors import MemplanError
from memplan.model import Op, Storage, Trace
from memplan.sim.comm import simulate_comm

MB = 2**20
ALLREDUCE = "c10d.allreduce_.default"


def test_ring_all_reduce_approaches_twice_the_payload_over_the_link():
    link = LINKS["nvlink4"]
    big = collective_s("all_reduce", 1024 * MB, 8, link)
    # Bus bandwidth of a large ring all-reduce tends to the link's effective rate.
    assert bus_bandwidth("all_reduce", 1024 * MB, 8, big) == pytest.approx(link.bytes_per_s * 0.85, rel=1e-2)
    small = collective_s("all_reduce", 8, 8, link)
    assert small == pytest.approx(2 * 7 * link.latency_s, rel=1e-3)  # latency-bound


def test_tree_beats_ring_on_small_messages_at_scale_and_loses_on_large():
    link = LINKS["ib-ndr"]
    assert collective_s("all_reduce", 1024, 512, link, "tree") < collective_s("all_reduce", 1024, 512, link, "ring")
    assert collective_s("all_reduce", 1024 * MB, 8, link, "tree") > collective_s("all_reduce", 1024 * MB, 8, link)
    assert collective_s("all_reduce", 1024, 512, link, "tree") == pytest.approx(
        2 * math.ceil(math.log2(512)) * link.latency_s + 2 * 1024 / (link.bytes_per_s * 0.85))


def test_one_rank_moves_nothing_and_bad_names_are_user_errors():
    assert collective_s("all_gather", MB, 1, LINKS["pcie4"]) == 0.0
    with pytest.raises(MemplanError, match="unknown collective"):
        collective_s("gossip", MB, 2, LINKS["pcie4"])
    with pytest.raises(MemplanError, match="unknown link"):
        job_link(16, 8, "nvlink4", "carrier-pigeon")


def test_jobs_beyond_one_node_are_bound_by_the_network():
    h100 = get_profile("h100")
    assert job_link(8, h100.gpus_per_node, h100.intra_link, h100.inter_link).name == "nvlink4"
    assert job_link(64, h100.gpus_per_node, h100.intra_link, h100.inter_link).name == "ib-ndr"


def _trace_with_allreduce(compute_after: int) -> Trace:
    """op 0 fills a bucket, op 1 all-reduces it, `compute_after` independent ops, then one reads it."""
    n = compute_after + 3
    storages = (Storage(id=0, nbytes=64 * MB, kind="grad", alloc_op=0, free_op=n),
                Storage(id=1, nbytes=64 * MB, kind="activation", alloc_op=0, free_op=n))
    ops = [Op(index=0, name="aten.mul.Tensor", phase="backward", writes=(0,), duration_s=1e-3),
           Op(index=1, name=ALLREDUCE, phase="backward", reads=(0,), writes=(0,))]
    ops += [Op(index=2 + i, name="aten.mm.default", phase="backward", reads=(1,), duration_s=1e-3)
            for i in range(compute_after)]
    ops.append(Op(index=n - 1, name="aten.copy_.default", phase="optimizer", reads=(0,), duration_s=1e-3))
    return Trace(storages=storages, ops=tuple(ops), meta={"world_size": 8})


def test_compute_that_does_not_need_the_collective_hides_it():
    comm = collective_s("all_reduce", 64 * MB, 8, LINKS["nvlink4"])
    exposed = simulate_comm(_trace_with_allreduce(0), "h100")
    hidden = simulate_comm(_trace_with_allreduce(10), "h100")
    launch = get_profile("h100").launch_s
    assert exposed.comm_s == pytest.approx(comm)
    # Nothing to overlap: the reader waits for the whole all-reduce.
    assert exposed.iteration_s == pytest.approx(2e-3 + comm)  # issued at 1 ms, read when it lands
    # 10 ms of independent compute covers the ~0.4 ms all-reduce: no exposed communication.
    assert comm < 10e-3
    assert hidden.iteration_s == pytest.approx(12e-3 + launch) and hidden.exposed_comm_s == pytest.approx(0)


def test_a_trace_without_world_size_needs_one():
    trace = _trace_with_allreduce(1)
    bare = Trace(storages=trace.storages, ops=trace.ops)
    with pytest.raises(MemplanError, match="world size"):
        simulate_comm(bare, "h100")
    assert simulate_comm(bare, "h100", world_size=1).comm_s == 0.0
