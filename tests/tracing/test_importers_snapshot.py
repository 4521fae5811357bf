"""PyTorch CUDA memory snapshot importer."""

import json
import os
import pickle

import pytest
import torch

from memplan.errors import MemplanError, TraceFormatError
from memplan.tracing.formats import load_any
from memplan.tracing.importers.snapshot import read_snapshot, snapshot_to_trace

BWD = [{"filename": "/x/torch/autograd/graph.py", "line": 1, "name": "_engine_run_backward"}]
OPT = [{"filename": "/x/torch/optim/adam.py", "line": 3, "name": "step"}]


def ev(action, addr, size, frames=()):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": list(frames)}


def freed(addr, size, frames=()):
    return [ev("free_requested", addr, size, frames), ev("free_completed", addr, size, frames)]


def sample_snapshot():
    """Events with address reuse, an early free, ignored kinds; expected lifetimes in the test."""
    events = [
        ev("segment_alloc", 0x1000, 2 << 20),
        ev("alloc", 0x1000, 512),  # op 0: A
        ev("alloc", 0x1200, 1024),  # op 1: B
        *freed(0x9000, 4096),  # allocated before the window: skipped, no op
        *freed(0x1000, 512),  # op 2: A ends
        ev("alloc", 0x1000, 2048, BWD),  # op 3: C reuses A's address, backward
        {"action": "oom", "size": 1 << 40, "device_free": 0, "frames": []},
        {"action": "snapshot", "addr": 0, "size": 0, "frames": []},
        *freed(0x1200, 1024, BWD),  # op 4: B ends
        ev("alloc", 0x5000, 256, OPT),  # op 5: D, optimizer, never freed
        ev("segment_free", 0x7000, 2 << 20),
    ]
    segments = [{"device": 0, "address": 0x1000, "total_size": 2 << 20, "stream": 0, "blocks": [
        {"size": 2048, "requested_size": 2000, "state": "active_allocated", "frames": []},  # C, live
        {"size": 8192, "requested_size": 8192, "state": "active_allocated", "frames": []},  # a weight
        {"size": 4096, "requested_size": 4096, "state": "inactive", "frames": []},
    ]}]
    return {"segments": segments, "device_traces": [events]}


# (nbytes, alloc_op, free_op, persistent) of every storage, written out by hand; a request's
# size counts as the allocator's block (at least 512 bytes, a multiple of 512): D asked for 256.
EXPECTED = [(512, 0, 2, False), (1024, 1, 4, False), (2048, 3, 6, False), (512, 5, 6, False),
            (8192, 0, 6, True)]


def shape(trace):
    return [(s.nbytes, s.alloc_op, s.free_op, s.persistent) for s in trace.storages]


def test_snapshot_dict_lifetimes_and_phases():
    trace = snapshot_to_trace(sample_snapshot())
    assert shape(trace) == EXPECTED
    assert [op.name for op in trace.ops] == ["alloc", "alloc", "free", "alloc", "free", "alloc"]
    assert [op.phase for op in trace.ops] == ["forward"] * 3 + ["backward"] * 2 + ["optimizer"]
    assert trace.meta["source"] == "snapshot" and trace.meta["skipped_frees"] == 1
    assert trace.storages[4].name == hex(0x1000 + 2048)
    assert trace.peak_load_bytes == 8192 + 1024 + 2048  # op 3: B and C alive


def test_free_on_requested_and_without_preexisting():
    snap = sample_snapshot()
    ev_list = snap["device_traces"][0]
    # A request whose completion is never recorded still ends the lifetime when asked to.
    ev_list.insert(-1, ev("free_requested", 0x5000, 256))
    trace = snapshot_to_trace(snap, free_on="requested", preexisting=False)
    assert shape(trace) == [(512, 0, 2, False), (1024, 1, 4, False), (2048, 3, 7, False), (512, 5, 6, False)]
    with pytest.raises(MemplanError, match="free_on"):
        snapshot_to_trace(snap, free_on="never")


def test_pickle_file_is_detected_and_read(tmp_path):
    path = tmp_path / "snap.pickle"
    with open(path, "wb") as fh:
        pickle.dump(sample_snapshot(), fh)  # what torch.cuda.memory._dump_snapshot writes
    trace = load_any(path)
    assert shape(trace) == EXPECTED
    assert load_any(path, "snapshot") == trace


def test_json_snapshot_is_detected(tmp_path):
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(sample_snapshot(), indent=2))
    assert shape(load_any(path)) == EXPECTED


class _Evil:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_malicious_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"device_traces": [[_Evil(marker)]], "segments": []}))
    with pytest.raises(TraceFormatError, match="refusing to load"):
        load_any(path)
    with pytest.raises(TraceFormatError, match="refusing"):
        read_snapshot(path)
    assert not marker.exists()


def test_bad_snapshots_name_the_problem(tmp_path):
    with pytest.raises(TraceFormatError, match="device_traces"):
        snapshot_to_trace({"segments": []})
    with pytest.raises(TraceFormatError, match="no alloc/free events"):
        snapshot_to_trace({"segments": [], "device_traces": [[ev("segment_alloc", 0, 10)]]})
    with pytest.raises(TraceFormatError, match="event 1: field 'size'"):
        snapshot_to_trace({"device_traces": [[ev("alloc", 0, 10), ev("alloc", 16, "big")]]})
    with pytest.raises(TraceFormatError, match="device 3"):
        snapshot_to_trace(sample_snapshot(), device=3)
    path = tmp_path / "trunc.pickle"
    path.write_bytes(pickle.dumps(sample_snapshot())[:40])
    with pytest.raises(TraceFormatError, match="trunc.pickle"):
        read_snapshot(path)


def test_busiest_device_is_picked():
    snap = sample_snapshot()
    snap["device_traces"].insert(0, [ev("alloc", 0x10, 64)])
    snap["segments"][0]["device"] = 1
    trace = snapshot_to_trace(snap)
    assert trace.meta["device"] == 1 and shape(trace) == EXPECTED
    assert shape(snapshot_to_trace(snap, device=0)) == [(512, 0, 1, False)]  # 64 bytes asked, one block


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_snapshot_peak_matches_allocator(tmp_path):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).cuda()
        x = torch.randn(256, 512, device="cuda")
        model(x).square().mean().backward()
        torch.cuda.synchronize()
        path = tmp_path / "snap.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    trace = load_any(path)
    assert trace.meta["source"] == "snapshot"
    # Window allocations plus blocks allocated earlier (pre-existing) give the allocator's own peak.
    assert trace.peak_load_bytes == torch.cuda.max_memory_allocated()


def test_multi_iteration_snapshot_cut_to_one_iteration():
    from memplan.tracing.importers.snapshot import snapshot_records
    from memplan.tracing.iteration import cut_iteration

    def step(extra=()):
        # Activations at fresh addresses each step (the caching allocator need not reuse them).
        out = [ev("alloc", 0x100, 64), ev("alloc", 0x200, 128), ev("alloc", 0x300, 32), *freed(0x300, 32)]
        out += [*extra, *freed(0x200, 128), *freed(0x100, 64)]
        return out

    warm = step([ev("alloc", 0x900, 512)])  # optimizer state, first step only
    snap = {"segments": [], "device_traces": [[ev("alloc", 0x10, 16)] + warm + step() * 3]}
    cut = cut_iteration(snapshot_records(snap))
    assert cut.period == 6  # three allocs, three completed frees
    got = sorted((s.nbytes, s.alloc_op, s.free_op, s.persistent) for s in cut.trace.storages)
    assert got == [(16, 0, 6, True), (32, 2, 3, False), (64, 0, 5, False), (128, 1, 4, False),
                   (512, 0, 6, True)]
