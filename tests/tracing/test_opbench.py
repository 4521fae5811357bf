"""Op times of a fake trace: every op timed alone on real random inputs (`trace(..., time_ops=True)`)."""

import json

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from memplan.cli import main
from memplan.errors import MemplanError
from memplan.tracing import opbench
from memplan.tracing.fake import new_fake_mode
from memplan.tracing.tracer import trace
from memplan.workflows.workloads import trace_workload
from memplan.zoo import Workload

TINY_GPT2 = {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 32, "vocab_size": 97, "seq_len": 32}
SMALL_ENCODER = ["num_layers=1", "seq_len=16", "d_model=32"]
WIDTH, DEPTH = 16, 4


def _untimed_rows(tr):
    ops = [(o.name, o.phase, o.module, o.reads, o.writes, o.flops, o.bytes_accessed, o.conv) for o in tr.ops]
    return ops, tr.storages, tr.owners


def _meta_without_timing(tr):
    return {k: v for k, v in tr.meta.items() if k not in ("op_times", "trace_seconds", "torch_threads")}


@pytest.mark.parametrize("name, batch, config", [("resnet18-cifar", 2, {"input_size": 8}),
                                                  ("transformer-encoder", 2, {"seq_len": 32}),
                                                  ("hf:gpt2", 2, TINY_GPT2)])
def test_every_op_gets_a_positive_time_and_the_trace_is_otherwise_unchanged(name, batch, config):
    plain = trace_workload(name, batch, fake=True, **config)
    rng = torch.get_rng_state()
    timed = trace_workload(name, batch, fake=True, time_ops=True, **config)
    assert torch.equal(torch.get_rng_state(), rng)  # dropout timed alone drew from private state only
    assert all(o.duration_s is not None and o.duration_s > 0 for o in timed.ops)
    assert all(o.duration_s is None for o in plain.ops)
    assert _untimed_rows(timed) == _untimed_rows(plain)
    assert _meta_without_timing(timed) == _meta_without_timing(plain)
    summary = timed.meta["op_times"]
    assert summary["failed"] == {} and summary["timed_ops"] == len(timed.ops) and summary["device"] == "cpu"
    assert summary["distinct_calls"] < len(timed.ops)  # identical calls timed once


class _Signatures(TorchDispatchMode):
    """The oracle for 'identical': every aten call of a real step with its tensors' shapes, strides
    and dtypes and its other arguments, written without the code under test."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        def describe(value):
            if isinstance(value, torch.Tensor):
                return ("tensor", tuple(value.shape), tuple(value.stride()), value.dtype)
            if isinstance(value, (list, tuple)):
                return tuple(describe(v) for v in value)
            return repr(value)

        if func.namespace == "aten":  # not the profiler's record_function markers
            self.calls.append((str(func), describe(args), describe(sorted((kwargs or {}).items()))))
        return func(*args, **(kwargs or {}))


def _deep_mlp(batch, **_):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = (torch.randn(batch, WIDTH), torch.randn(batch, WIDTH))
    return Workload(name="mlp", model=model, optimizer=optimizer, inputs=inputs, batch=batch, input_size=None,
                    device=torch.device("cpu"), seed=0, config={},
                    loss_fn=lambda m, x, y: nn.functional.mse_loss(m(x), y))


def test_identical_calls_are_timed_once(monkeypatch):
    measured = []
    real_least_mean = opbench.least_mean_s

    def counting(timed, round_s):
        measured.append(1)
        return real_least_mean(timed, round_s) + len(measured) * 1e-3  # each measurement tells itself apart

    monkeypatch.setattr(opbench, "least_mean_s", counting)
    tr = trace_workload(_deep_mlp, 4, fake=True, time_ops=True)
    work = _deep_mlp(4)
    work.step(*work.inputs)  # the warm-up the tracer runs
    with _Signatures() as oracle, torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        work.step(*work.inputs)  # under saved-tensor hooks, as the tracer records (memplan.tracing.tracer)
    assert len(oracle.calls) == len(tr.ops)
    assert len(measured) == len(set(oracle.calls)) == tr.meta["op_times"]["distinct_calls"]
    first_time: dict = {}
    for call, op in zip(oracle.calls, tr.ops):
        assert first_time.setdefault(call, op.duration_s) == op.duration_s  # same call, same (cached) time
    forward_mm = [o.duration_s for o in tr.ops if o.phase == "forward" and o.name == "aten.addmm.default"]
    assert len(forward_mm) == DEPTH and len(set(forward_mm)) == 1


class _OneRowEmbedding(nn.Module):
    """Indices into a table of one row, and loss targets among three classes: made-up indices must
    stay in bounds (ones, as RuntimeEstimator uses, would index past the single row)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, tokens):
        hidden = self.embed(tokens).mean(dim=1)
        return self.head(hidden).gather(1, torch.zeros_like(tokens[:, :1]))


def _index_workload(batch, **_):
    torch.manual_seed(0)
    model = _OneRowEmbedding()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs = (torch.zeros(batch, 5, dtype=torch.long), torch.randint(0, 3, (batch,)))
    return Workload(name="index", model=model, optimizer=optimizer, inputs=inputs, batch=batch, input_size=None,
                    device=torch.device("cpu"), seed=0, config={},
                    loss_fn=lambda m, x, y: nn.functional.cross_entropy(m(x).expand(-1, 3), y))


def test_index_ops_get_in_bounds_indices_and_a_time():
    tr = trace_workload(_index_workload, 4, fake=True, time_ops=True)
    names = {o.name for o in tr.ops}
    assert {"aten.embedding.default", "aten.embedding_dense_backward.default", "aten.gather.default",
            "aten.nll_loss_forward.default"} <= names
    assert tr.meta["op_times"]["failed"] == {}
    assert all(o.duration_s > 0 for o in tr.ops)


def _meta(shape, stride, dtype, first=0):
    return opbench.TensorMeta(shape=shape, stride=stride, dtype=dtype, device=torch.device("cpu"), first=first)


def test_made_up_tensors_keep_shape_strides_dtype_and_bounds():
    gen = torch.Generator().manual_seed(0)
    channels_last = _meta((2, 3, 4, 5), (60, 1, 15, 3), torch.float32)
    t = opbench.random_tensor(channels_last, 7, gen)
    assert t.shape == (2, 3, 4, 5) and t.stride() == (60, 1, 15, 3) and t.dtype == torch.float32
    assert bool(((t >= 0) & (t < 1)).all())
    expanded = _meta((3, 4), (0, 1), torch.int64)
    idx = opbench.random_tensor(expanded, 3, gen)
    assert idx.stride() == (0, 1) and int(idx.min()) >= 0 and int(idx.max()) < 3
    leaves = (expanded, _meta((9, 2, 0), (2, 1, 1), torch.float32, first=1), 5)
    assert opbench.index_bound(leaves) == 2  # the smallest non-zero dimension of any tensor


def test_in_place_ops_leave_real_arguments_alone():
    bench = opbench.OpBench("cpu")
    constant = torch.arange(4.0)
    with new_fake_mode() as mode:
        fake = mode.from_tensor(torch.zeros(4))
    call = bench.call(torch.ops.aten.add_.Tensor, (constant, fake), {})
    bench.time(0, call)
    assert torch.equal(constant, torch.arange(4.0))
    assert bench.durations(1)[0] > 0


def test_an_in_place_view_op_is_timed_with_its_arguments_before_it_ran():
    bench = opbench.OpBench("cpu")
    with new_fake_mode() as mode:
        x = mode.from_tensor(torch.zeros(2, 3))
        call = bench.call(torch.ops.aten.t_.default, (x,), {})
        x.t_()
    assert call.leaves[0].shape == (2, 3) and tuple(x.shape) == (3, 2)
    bench.time(0, call)
    assert bench.durations(1)[0] > 0 and bench.summary()["failed"] == {}


def test_an_op_that_fails_alone_keeps_no_time_and_is_counted():
    bench = opbench.OpBench("cpu")
    with new_fake_mode() as mode:
        x = mode.from_tensor(torch.zeros(3, dtype=torch.long))
    # integer remainder by made-up zeros (the bound of a 1-element divisor is 1): fails alone
    divisor = opbench.OpBench("cpu").call(torch.ops.aten.remainder.Tensor, (x, x[:1]), {})
    bench.time(0, divisor)
    bench.time(1, divisor)
    assert bench.durations(2) == [None, None]
    assert bench.summary()["failed"] == {"aten.remainder.Tensor": 1}  # measured once, cached


def test_an_op_taking_a_generators_state_is_not_run_and_is_counted():
    """Attention backward reads its philox seed and offset where the forward left them: made-up ones
    crashed the process on an H200, so the op is priced instead of run."""
    bench = opbench.OpBench("cpu")
    q = torch.zeros(1, 2, 4, 8)
    seed, offset = torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long)
    backward = torch.ops.aten._scaled_dot_product_efficient_attention_backward.default
    args = (q, q, q, q, None, q, torch.zeros(1, 2, 4), seed, offset, 0.1, [True, True, True, False])
    assert bench.call(backward, args, {}) is None
    assert bench.call(backward, args[:7], {"philox_seed": seed, "philox_offset": offset, "dropout_p": 0.1,
                                           "grad_input_mask": [True] * 4}) is None
    assert bench.call(torch.ops.aten.mul.Tensor, (q, q), {}) is not None  # any other op is timed
    assert bench.summary()["not_run"] == {str(backward): 2}


def test_time_ops_needs_a_fake_trace():
    work = _deep_mlp(2)
    with pytest.raises(MemplanError, match="fake trace"):
        trace(work.step, *work.inputs, fake=False, time_ops=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_timing_a_cuda_trace_needs_cuda():
    with pytest.raises(MemplanError, match="no CUDA"):
        opbench.OpBench("cuda")


def test_cli_times_ops_of_a_fake_trace(capsys, tmp_path):
    out = tmp_path / "t.jsonl"
    assert main(["trace", "transformer-encoder", "--batch", "2", "--config", *SMALL_ENCODER, "--time-ops", "-o",
                 str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["meta"]["op_times"]["failed"] == {}
    from memplan.tracing.io import read_trace

    assert all(o.duration_s > 0 for o in read_trace(out).ops)


@pytest.mark.parametrize("extra", [["--real"], ["--ddp", "--world-size", "2"]])
def test_cli_time_ops_with_a_real_or_engine_trace_is_one_error_line(capsys, tmp_path, extra):
    out = tmp_path / "t.jsonl"
    assert main(["trace", "transformer-encoder", "--batch", "2", "--time-ops", *extra, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--time-ops" in err[0]
    assert not out.exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fake_cuda_trace_ops_are_timed_on_the_gpu():
    tr = trace_workload("transformer-encoder", 2, fake=True, device="cuda", time_ops=True)
    assert tr.meta["op_times"]["device"].startswith("cuda") and tr.meta["op_times"]["failed"] == {}
    assert all(o.duration_s > 0 for o in tr.ops)


def test_ops_whose_arguments_are_a_forwards_state_or_structure_are_not_run():
    """Finding 10: beyond philox seeds, made-up cuDNN RNN dropout states and reserve spaces, and embedding
    bags' offsets, are read by their kernels as what the forward (or the data) made them: made-up ones can
    write out of bounds on a device, which poisons its context. They are priced instead."""
    bench = opbench.OpBench("cpu")
    x, state = torch.zeros(4, 2, 8), torch.zeros(64, dtype=torch.uint8)
    rnn = torch.ops.aten._cudnn_rnn.default
    args = (x, [x], 1, None, x, None, 2, 8, 0, 1, False, 0.5, True, False, [], state)
    assert bench.call(rnn, args, {}) is None
    bag = torch.ops.aten._embedding_bag.default
    assert bench.call(bag, (torch.zeros(10, 4), torch.zeros(6, dtype=torch.long), torch.zeros(2, dtype=torch.long)),
                      {}) is None
    assert bench.summary()["not_run"] == {str(rnn): 1, str(bag): 1}


def test_made_up_indices_stay_below_an_int_bound_of_the_call():
    """Finding 10: embedding backward scatters into `num_weights` rows, an int argument: indices bounded
    only by the tensors' dimensions could write past them."""
    bench = opbench.OpBench("cpu")
    with new_fake_mode() as mode:
        grad = mode.from_tensor(torch.zeros(8, 16, 32))
        indices = mode.from_tensor(torch.zeros(8, 16, dtype=torch.long))
    call = bench.call(torch.ops.aten.embedding_dense_backward.default, (grad, indices, 3, -1, False), {})
    args, _ = bench._materialize(call)
    assert int(args[1].max()) < 3
    bench.time(0, call)
    assert bench.durations(1)[0] > 0


def test_op_times_are_kept_under_an_allocator_without_statistics(monkeypatch):
    """Finding 11: under the pool allocator (a pluggable one) the inner-memory measurement's
    reset_peak_memory_stats raises, and the failure discarded every op's time."""
    import contextlib

    class OnTheGpu(opbench.OpBench):
        _cuda = True

    def no_statistics(*args, **kwargs):
        raise RuntimeError("CUDAPluggableAllocator does not yet support getDeviceStats.")

    monkeypatch.setattr(torch.cuda, "memory_stats", no_statistics)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.random, "fork_rng", lambda devices=(): contextlib.nullcontext())
    monkeypatch.setattr(opbench, "cuda_timer", opbench.wall_timer)
    monkeypatch.setattr(opbench, "inner_memory", lambda fn: no_statistics())
    bench = OnTheGpu("cpu")
    bench.time(0, bench.call(torch.ops.aten.mul.Tensor, (torch.ones(4), torch.ones(4)), {}))
    assert bench.durations(1)[0] > 0 and bench.summary()["failed"] == {}
    assert bench.inner_bytes() == {} and bench.summary()["inner_memory"] == "the allocator keeps no statistics"
