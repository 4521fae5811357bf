"""Iteration detection in malloc/free streams (paper 000 §V)."""

import numpy as np
import pytest

from memplan.errors import MemplanError
from memplan.tracing.iteration import Record, as_records, cut_iteration, detect_period, signatures

PARAMS = [("malloc", f"w{i}", 100 + i) for i in range(3)]


def one_iteration(layers, *, workspace=16, loss_carry=False):
    """Forward allocs, a workspace per layer, backward frees in reverse; block ids reused."""
    recs = []
    if loss_carry:
        recs.append(("malloc", "act0", layers[0]))  # first malloc, then the previous loss is freed
        recs.append(("free", "loss"))
        start = 1
    else:
        start = 0
    for i in range(start, len(layers)):
        recs.append(("malloc", f"act{i}", layers[i]))
    for i in range(len(layers)):
        recs.append(("malloc", "ws", workspace))
        recs.append(("free", "ws"))
    for i in reversed(range(len(layers))):
        recs.append(("malloc", f"grad{i}", layers[i]))
        recs.append(("free", f"act{i}"))
        recs.append(("free", f"grad{i}"))
    if loss_carry:
        recs.append(("malloc", "loss", 7))  # lives into the next iteration
    return recs


def live_after(records):
    """Oracle: bytes alive after each record, by replaying the stream with a dict."""
    live, out = {}, []
    for kind, block, *size in records:
        if kind == "malloc":
            live[block] = size[0]
        elif kind == "free":
            live.pop(block, None)
        out.append(sum(live.values()))
    return out


def intervals(records):
    """Oracle: (size, malloc offset, free offset or len) of every block allocated in `records`."""
    open_, out = {}, []
    for i, (kind, block, *size) in enumerate(records):
        if kind == "malloc":
            open_[block] = (size[0], i)
        elif kind == "free" and block in open_:
            s, lo = open_.pop(block)
            out.append((s, lo, i))
    out += [(s, lo, len(records)) for s, lo in open_.values()]
    return sorted(out)


def cut_intervals(trace):
    """(size, alloc, free) of the cut's storages that are allocated inside it."""
    return sorted((s.nbytes, s.alloc_op, s.free_op) for s in trace.storages
                  if any(op.name == "malloc" and s.id in op.writes for op in trace.ops))


LAYERS = [40, 40, 40, 40, 24, 8]  # identical layers repeat inside one iteration


def test_noise_free_stream_finds_period_and_cuts_one_iteration():
    it = one_iteration(LAYERS)
    stream = PARAMS + it * 4
    cut = cut_iteration(stream)
    assert cut.period == len(it)
    assert cut_intervals(cut.trace) == intervals(it)
    assert [op.name for op in cut.trace.ops] == [r[0] for r in it]
    persistent = sorted(s.nbytes for s in cut.trace.storages if s.persistent)
    assert persistent == [100, 101, 102]
    assert cut.trace.meta["source"] == "iteration"


def test_different_warmup_iteration_is_skipped():
    it = one_iteration(LAYERS)
    # Warm-up: another workspace size, and optimizer state allocated once at its end.
    warm = one_iteration(LAYERS, workspace=64) + [("malloc", "adam0", 300), ("malloc", "adam1", 301)]
    stream = PARAMS + warm + it * 3 + it[:5]  # the recording stops inside an iteration
    cut = cut_iteration(stream)
    assert cut.period == len(it)
    assert cut.steady_from >= len(PARAMS) + len(warm) - len(it)
    assert cut.start >= cut.steady_from
    assert cut_intervals(cut.trace) == intervals(it)
    assert sorted(s.nbytes for s in cut.trace.storages if s.persistent) == [100, 101, 102, 300, 301]
    # The cut's load curve is the steady-state load of the stream at the same records.
    expected = live_after(stream)[cut.start: cut.start + cut.period]
    assert cut.trace.load.tolist() == expected


def carry_iteration(layers, *, first=False):
    """A block allocated mid-backward and freed after the next iteration's forward."""
    recs = [("malloc", f"act{i}", n) for i, n in enumerate(layers)]
    if not first:
        recs.append(("free", "carry"))
    half = len(layers) // 2
    for i in reversed(range(len(layers))):
        if i == half:
            recs.append(("malloc", "carry", 7))
        recs += [("malloc", f"grad{i}", layers[i]), ("free", f"act{i}"), ("free", f"grad{i}")]
    return recs


def test_block_living_across_the_boundary_becomes_head_and_tail():
    it = carry_iteration(LAYERS)
    stream = PARAMS + carry_iteration(LAYERS, first=True) + it * 3
    cut = cut_iteration(stream)
    assert cut.period == len(it)
    assert [op.name for op in cut.trace.ops] == [r[0] for r in it]
    expected = live_after(stream)[cut.start: cut.start + cut.period]
    assert cut.trace.load.tolist() == expected
    carry = [s for s in cut.trace.storages if s.nbytes == 7]
    freed, allocated = it.index(("free", "carry")), it.index(("malloc", "carry", 7))
    # The previous iteration's block at the head and this iteration's at the tail.
    assert sorted((s.alloc_op, s.free_op) for s in carry) == [(0, freed), (allocated, len(it))]
    assert not any(s.persistent for s in carry)


def test_detect_period_on_plain_sequences():
    seq = np.array([9, 8] + [1, 2, 3, 1, 2, 4] * 3)
    assert detect_period(seq) == (6, 2)
    # The repetition inside one period (1, 2) does not win over the real period.
    with pytest.raises(MemplanError, match="no repeating iteration"):
        detect_period(np.array([1, 2, 3, 4, 5]))


def test_signatures_ignore_addresses():
    a = as_records([("malloc", "x", 8), ("free", "x"), ("malloc", "y", 8), ("free", "y")])
    sig = signatures(a)
    assert sig[0] == sig[2] and sig[1] == sig[3] and sig[0] != sig[1]
    b = as_records([{"kind": "malloc", "addr": 5, "size": 8}, Record(kind="free", block=5)])
    assert list(signatures(b)) == list(sig[:2])


def test_reads_and_writes_become_op_accesses():
    it = [("malloc", "a", 10), ("write", "a"), ("malloc", "b", 20), ("read", "a"), ("write", "b"),
          ("free", "a"), ("read", "b"), ("free", "b")]
    cut = cut_iteration(it * 3)
    assert cut.period == len(it)
    ops = cut.trace.ops
    a = next(s.id for s in cut.trace.storages if s.nbytes == 10)
    assert cut.trace.accesses[a] == tuple(i for i, r in enumerate(it) if r[1] == "a" and r[0] != "free")
    assert ops[3].reads == (a,) and ops[1].writes == (a,)


def test_bad_records_are_user_errors():
    with pytest.raises(MemplanError, match="kind"):
        as_records([("alloc", "x", 8)])
    with pytest.raises(MemplanError, match="size"):
        as_records([("malloc", "x")])
    with pytest.raises(MemplanError):
        as_records([42])
