"""The CUDA stand-in (memplan.testing.cuda_rules) fails where a GPU would, and only there: each rule of
its docstring broken once, and kept once, on plain CPU tensors."""

from __future__ import annotations

import pytest
import torch

from memplan.testing.cuda_rules import CudaRuleError, CudaRules


@pytest.fixture
def cuda():
    rules = CudaRules()
    with rules:
        yield rules


def _copy_on(cuda, stream, dst, src):
    stream.wait_stream(cuda.current_stream())
    with cuda.stream(stream):
        dst.copy_(src)
    return stream.record_event()


def test_a_copys_result_is_used_only_after_its_event_is_waited_on(cuda):
    lane, src, dst = cuda.Stream(), torch.ones(8), torch.empty(8)
    done = _copy_on(cuda, lane, dst, src)
    with pytest.raises(CudaRuleError, match="stream default reads bytes stream side1 wrote without waiting"):
        dst.sum()
    cuda.current_stream().wait_event(done)
    assert dst.sum().item() == 8  # ordered now


def test_a_stream_writes_bytes_another_reads_only_after_waiting_for_the_read(cuda):
    lane, src, host = cuda.Stream(), torch.ones(8), torch.empty(8)
    _copy_on(cuda, lane, host, src)  # the lane reads src
    with pytest.raises(CudaRuleError, match="stream default writes bytes stream side1 reads"):
        src.add_(1)


def test_regions_of_one_buffer_are_apart(cuda):
    """A slab's regions share a storage: bytes that do not overlap do not race."""
    lane, slab, src = cuda.Stream(), torch.zeros(16), torch.ones(8)
    done = _copy_on(cuda, lane, slab[:8], src)
    slab[8:].add_(1)  # other bytes of the same storage: no wait needed
    with pytest.raises(CudaRuleError):
        slab[4:12].sum()
    cuda.current_stream().wait_event(done)


def test_a_block_another_stream_reads_is_reused_only_after_an_event_or_record_stream(cuda):
    lane, host = cuda.Stream(), torch.empty(1024)
    for how in ("event", "record_stream", None):
        src = torch.ones(1024)
        done = _copy_on(cuda, lane, host, src)
        if how == "event":
            cuda.current_stream().wait_event(done)
        elif how == "record_stream":
            cuda.record_stream(src, lane)
        src.untyped_storage().resize_(0)  # what the executor's release does
        if how is None:
            with pytest.raises(CudaRuleError, match="stream default allocates while a block it freed may still be "
                                                    "read by stream side1"):
                torch.zeros(1)  # the stream's next allocation could be handed the block
        else:
            torch.zeros(1)
        cuda.current_stream().wait_event(done)


def test_a_host_synchronize_orders_everything_before_it(cuda):
    lane, src, dst = cuda.Stream(), torch.ones(8), torch.empty(8)
    _copy_on(cuda, lane, dst, src)
    cuda.synchronize()
    assert dst.sum().item() == 8 and cuda.host_syncs[-1] == "aten._local_scalar_dense.default reads a device value " \
                                                          "on the host"


def _capturing(cuda, body, pool=None):
    graph, side = cuda.CUDAGraph(), cuda.Stream()
    with cuda.graph(graph, pool=pool, stream=side):
        body(side)
    return graph


def _first_error(cuda, body) -> str:
    """The error that broke a capture of `body` (ending it then fails "due to a previous error")."""
    with pytest.raises(CudaRuleError) as failed:
        _capturing(cuda, body)
    first = failed.value
    while first.__context__ is not None:
        first = first.__context__
    return str(first)


def test_a_captured_stream_waits_only_on_events_of_its_capture(cuda):
    lane, src, dst = cuda.Stream(), torch.ones(4), torch.empty(4)
    before = _copy_on(cuda, lane, dst, src)
    pool = cuda.graph_pool_handle()
    with pytest.raises(CudaRuleError) as failed:
        _capturing(cuda, lambda side: side.wait_event(before), pool)
    assert "cudaErrorStreamCaptureIsolation" in str(failed.value.__context__)
    assert str(failed.value) == "operation failed due to a previous error during capture"
    assert cuda.captures_underway == [pool]  # as CUDAGraph::capture_end: the allocator still routes to the pool
    cuda._cuda_endAllocateToPool(0, pool)
    assert cuda.captures_underway == []
    with pytest.raises(RuntimeError, match="not currently recording"):
        cuda._cuda_endAllocateToPool(0, pool)


def test_a_capture_ends_with_every_stream_it_forked_joined_back(cuda):
    lane, x = cuda.Stream(), torch.ones(4)

    def fork(side):
        lane.wait_stream(side)  # the lane joins the capture
        with cuda.stream(lane):
            x.mul(2)

    assert "side1 not joined back to its origin" in _first_error(cuda, fork)

    def fork_and_join(side):
        fork(side)
        side.wait_stream(lane)

    assert _capturing(cuda, fork_and_join).captured


def test_no_host_wait_and_no_allocation_outside_the_pool_during_a_capture(cuda):
    x, lane = torch.ones(4), cuda.Stream()
    for body in (lambda side: x.sum().item(), lambda side: cuda.synchronize(),
                 lambda side: x[x > 0], lambda side: side.record_event().query()):
        assert "while a stream is being captured" in _first_error(cuda, body)

    def allocate_elsewhere(side):
        with cuda.stream(lane):
            torch.empty(4)

    assert "an allocation on stream side" in _first_error(cuda, allocate_elsewhere)
    with pytest.raises(CudaRuleError, match="non-default stream"):
        cuda.CUDAGraph().capture_begin()
    graph = _capturing(cuda, lambda side: torch.empty(4).add_(x))  # the capture's own allocation: its pool
    graph.replay()
    assert graph.replays == 1


def test_a_replay_needs_its_capture_and_the_blocks_it_took_from_outside_its_pool(cuda):
    with pytest.raises(CudaRuleError, match="without a preceding successful capture"):
        cuda.CUDAGraph().replay()
    weight = torch.ones(4)
    graph = _capturing(cuda, lambda side: weight.mul(2))
    graph.replay()
    weight.untyped_storage().resize_(0)
    weight.untyped_storage().resize_(16)  # the parameter lives elsewhere now
    with pytest.raises(CudaRuleError, match="freed or moved since"):
        graph.replay()


def test_a_replay_counts_as_the_replaying_streams_work(cuda):
    weight, lane = torch.ones(4), cuda.Stream()
    graph = _capturing(cuda, lambda side: weight.mul_(2))
    graph.replay()  # the lane has not waited for it
    with pytest.raises(CudaRuleError, match="stream side1 reads bytes stream default wrote"):
        with cuda.stream(lane):
            weight.sum()
