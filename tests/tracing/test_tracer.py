"""The tracer: storages, lifetimes, kinds, phases, modules, FLOPs and saved tensors of one iteration."""

import contextlib
import dataclasses
import json
import resource

import pytest
import torch
import torch.nn as nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from memplan.errors import MemplanError
from memplan.tracing.io import read_trace, write_trace
from memplan.tracing.opinfo import OPTIONAL_OPS
from memplan.tracing.tracer import trace
from memplan.workflows.workloads import trace_workload
from memplan.zoo import Workload

GIB = 2**30
CHANNELS = 8
CLASSES = 10


class SmallNet:
    """A zoo-like workload: conv/BN/ReLU(inplace)/conv/ReLU/linear with SGD momentum or Adam."""

    def __init__(self, batch: int = 4, input_size: int = 8, optimizer: str = "sgd"):
        torch.manual_seed(0)
        self.model = nn.Sequential(
            nn.Conv2d(3, CHANNELS, 3, padding=1), nn.BatchNorm2d(CHANNELS), nn.ReLU(inplace=True),
            nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1), nn.ReLU(), nn.Flatten(),
            nn.Linear(CHANNELS * input_size * input_size, CLASSES))
        params = self.model.parameters()
        self.optimizer = (torch.optim.Adam(params, lr=1e-3) if optimizer == "adam"
                          else torch.optim.SGD(params, lr=0.1, momentum=0.9))
        self.inputs = (torch.randn(batch, 3, input_size, input_size), torch.randint(0, CLASSES, (batch,)))

    def step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss


def small_net(batch, input_size=None, optimizer="sgd"):
    return SmallNet(batch, input_size or 8, optimizer)


def small_workload(batch, input_size=None, optimizer="sgd"):
    """SmallNet as a zoo Workload: what `memplan trace tests.tracing.test_tracer:small_workload` builds."""
    net = SmallNet(batch, input_size or 8, optimizer)
    return Workload(name="small", model=net.model, optimizer=net.optimizer, inputs=net.inputs, batch=batch,
                    input_size=input_size, device=torch.device("cpu"), seed=0, config={"optimizer": optimizer},
                    loss_fn=lambda model, x, y: nn.functional.cross_entropy(model(x), y))


@pytest.fixture(scope="module")
def real_trace():
    return trace_workload(small_net, 4, fake=False)


@pytest.fixture(scope="module")
def fake_trace():
    return trace_workload(small_net, 4, fake=True)


def _storage_rows(tr):
    return [(s.nbytes, s.kind, s.alloc_op, s.free_op, s.persistent, s.dtype, s.shape, s.name) for s in tr.storages]


def _op_rows(tr):
    return [(o.name, o.phase, o.module, o.reads, o.writes, o.flops, o.bytes_accessed) for o in tr.ops]


def test_fake_trace_equals_real_trace(real_trace, fake_trace):
    assert _storage_rows(fake_trace) == _storage_rows(real_trace)
    assert _op_rows(fake_trace) == _op_rows(real_trace)
    assert fake_trace.owners == real_trace.owners
    assert fake_trace.peak_load_bytes == real_trace.peak_load_bytes


class _LiveBytesLog(TorchDispatchMode):
    """Oracle: after every aten call, the bytes of every storage still alive.

    It knows the storages registered up front and every storage an op returned, and asks
    their weak references whether the framework has freed them yet.
    """

    def __init__(self, tensors):
        super().__init__()
        self.refs = {}
        self.log = []  # (op name, live bytes just after it)
        for t in tensors:
            self._see(t)

    def _see(self, t):
        storage = t.untyped_storage()
        self.refs.setdefault(StorageWeakRef(storage), storage.nbytes())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._see(t)
        self.log.append((str(func), sum(n for ref, n in self.refs.items() if not ref.expired())))
        return out


def test_peak_load_matches_raw_dispatch_log(real_trace, fake_trace):
    work = SmallNet(4)
    work.step(*work.inputs)  # the same warm-up the tracer runs
    state = [t for s in work.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    upfront = list(work.model.parameters()) + list(work.model.buffers()) + state + list(work.inputs)
    log = _LiveBytesLog(upfront)
    with log:
        work.step(*work.inputs)
    peak = max(load for _, load in log.log)
    assert real_trace.peak_load_bytes == peak and fake_trace.peak_load_bytes == peak
    # The whole curve, op by op. The raw log also holds metadata queries (prim, profiler
    # markers); detach calls differ under the tracer's saved-tensor hooks. None allocates.
    skip = ("prim.", "profiler.", "aten.detach.")
    raw = [(name, load) for name, load in log.log if not name.startswith(skip)]
    traced = [(op.name, int(load)) for op, load in zip(real_trace.ops, real_trace.load) if not op.name.startswith(skip)]
    assert traced == raw


def test_kinds_match_the_model(real_trace):
    work = SmallNet(4)
    params = list(work.model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    buffer_bytes = sum(b.numel() * b.element_size() for b in work.model.buffers())
    by_kind = real_trace.bytes_by_kind()
    assert by_kind["param"] == param_bytes + buffer_bytes
    assert by_kind["optimizer_state"] == param_bytes  # one momentum buffer per parameter
    assert by_kind["input"] == sum(t.numel() * t.element_size() for t in work.inputs)
    grads = [s for s in real_trace.storages if s.kind == "grad"]
    assert sorted(s.nbytes for s in grads) == sorted(p.numel() * p.element_size() for p in params)
    n = len(real_trace.ops)
    for s in real_trace.storages:
        assert s.persistent == (s.kind in ("param", "optimizer_state"))
        if s.persistent:
            assert (s.alloc_op, s.free_op) == (0, n)
    for g in grads:  # born in backward, alive to the end
        assert real_trace.ops[g.alloc_op].phase == "backward" and g.free_op == n


def test_activations_are_made_in_forward_and_freed_in_backward(real_trace):
    first_bwd = min(o.index for o in real_trace.ops if o.phase == "backward")
    first_opt = min(o.index for o in real_trace.ops if o.phase == "optimizer")
    acts = [s for s in real_trace.storages if s.kind == "activation"]
    assert acts
    # The conv, BN and ReLU outputs (batch x 8 x 8 x 8 floats) are saved for backward.
    assert sum(s.shape == (4, CHANNELS, 8, 8) for s in acts) >= 3
    for s in acts:
        assert real_trace.ops[s.alloc_op].phase == "forward" and s.free_op > first_bwd
    big = [s for s in acts if s.shape == (4, CHANNELS, 8, 8)]
    assert all(s.free_op <= first_opt for s in big)  # the framework frees them during backward


def test_phases_come_in_order_and_modules_are_named(real_trace):
    phases = [o.phase for o in real_trace.ops]
    order = {"forward": 0, "backward": 1, "optimizer": 2}
    assert [order[p] for p in phases] == sorted(order[p] for p in phases)
    by_name = {}
    for o in real_trace.ops:
        by_name.setdefault((o.name, o.phase), []).append(o.module)
    assert by_name[("aten.convolution.default", "forward")] == ["0", "3"]
    assert by_name[("aten.convolution_backward.default", "backward")] == ["3", "0"]
    assert by_name[("aten.native_batch_norm_backward.default", "backward")] == ["1"]
    assert by_name[("aten.addmm.default", "forward")] == ["6"]
    assert all(o.module == "" for o in real_trace.ops if o.phase == "optimizer")


def test_inplace_relu_writes_the_batch_norm_output(real_trace):
    ops = real_trace.ops
    bn = next(o for o in ops if o.name == "aten.native_batch_norm.default")
    relu_ = next(o for o in ops if o.name == "aten.relu_.default")
    names = [real_trace.storages[s].name for s in bn.writes]
    # Written in place first (the running statistics its schema does not mark), then its outputs.
    assert names[:2] == ["1.running_mean", "1.running_var"]
    assert relu_.writes == (bn.writes[2],) and relu_.reads == (bn.writes[2],)
    assert relu_.module == "2"


def test_views_access_the_storage_they_alias_and_move_no_data(real_trace):
    # A view needs its storage's bytes there (PyTorch checks a view's extent against them),
    # so it reads the storage it aliases, but it moves no data and allocates nothing.
    views = [o for o in real_trace.ops if o.name in ("aten.view.default", "aten.t.default", "aten.detach.default")]
    assert views
    assert all(len(o.reads) == 1 and o.writes == () and o.bytes_accessed == 0 for o in views)
    born = {s.alloc_op for s in real_trace.storages if not s.persistent and s.kind != "input"}
    assert not born & {o.index for o in views}


def test_conv_flops_and_bytes(real_trace):
    conv = next(o for o in real_trace.ops if o.name == "aten.convolution.default")
    batch, size, k = 4, 8, 3
    assert conv.flops == 2 * batch * CHANNELS * size * size * 3 * k * k
    x, w, b, y = batch * 3 * size * size, CHANNELS * 3 * k * k, CHANNELS, batch * CHANNELS * size * size
    assert conv.bytes_accessed == 4 * (x + w + b + y)


def test_trace_is_the_op_sequence_of_plain_training_under_saved_tensor_hooks(real_trace):
    # The tracer records under saved-tensor hooks (autograd then makes other detaches): under
    # identity hooks plain training runs the trace's ops exactly (as the interpreted executor does),
    # and without them the same ops but optional ones.
    def names(hooked: bool) -> list[str]:
        work = SmallNet(4)
        work.step(*work.inputs)
        seen = []

        class Names(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func.namespace != "prim" and any(isinstance(t, torch.Tensor) for t in tree_leaves((args, kwargs, out))):
                    seen.append(str(func))
                return out

        with Names(), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t) if hooked \
                else contextlib.nullcontext():
            work.step(*work.inputs)
        return seen

    traced = [o.name for o in real_trace.ops]
    assert names(hooked=True) == traced
    plain = names(hooked=False)
    assert plain != traced and [n for n in plain if n not in OPTIONAL_OPS] == [n for n in traced if n not in OPTIONAL_OPS]


def test_owners_name_parameters_gradients_and_optimizer_state(real_trace):
    by_storage = {o.storage: o for o in real_trace.owners}
    names = {s.name: s.id for s in real_trace.storages}
    assert by_storage[names["0.weight"]].kind == "param"
    assert by_storage[names["0.weight.grad"]] == type(by_storage[0])(storage=names["0.weight.grad"], kind="grad",
                                                                      name="0.weight")
    states = [o for o in real_trace.owners if o.kind == "state"]
    assert {o.key for o in states} == {"momentum_buffer"} and {o.group for o in states} == {0}
    assert sorted(o.index for o in states) == list(range(len(states)))
    assert all(real_trace.storages[o.storage].persistent for o in real_trace.owners if o.kind != "grad")


@pytest.mark.parametrize("warmup", [0, 1])
def test_adam_state_is_persistent_with_or_without_warmup(warmup):
    tr = trace_workload(small_net, 2, fake=True, warmup=warmup, optimizer="adam")
    n_params = len(list(SmallNet(2).model.parameters()))
    state = [s for s in tr.storages if s.kind == "optimizer_state"]
    assert len(state) == 3 * n_params  # exp_avg, exp_avg_sq, step
    assert all(s.persistent and (s.alloc_op, s.free_op) == (0, len(tr.ops)) for s in state)
    assert all(s.name.rsplit(".", 1)[-1] in ("exp_avg", "exp_avg_sq", "step") for s in state)


class _Huge:
    """An 8 GB linear layer: tracing it with fake tensors must not allocate it."""

    def __init__(self, batch, features=40_000, out=50_000):
        self.model = nn.Linear(features, out, bias=False)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.inputs = (torch.randn(batch, features),)

    def step(self, x):
        self.optimizer.zero_grad(set_to_none=True)
        self.model(x).sum().backward()
        self.optimizer.step()


def test_fake_tracing_allocates_nothing():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tr = trace_workload(_Huge, 2, fake=True)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    weight = 40_000 * 50_000 * 4
    assert tr.bytes_by_kind()["param"] == weight and tr.bytes_by_kind()["grad"] == weight
    assert tr.peak_load_bytes >= 2 * weight
    assert grown < GIB


def test_fake_flag_must_match_the_tensors():
    work = SmallNet(2)
    with pytest.raises(MemplanError, match="fake=True"):
        trace(work.step, *work.inputs, fake=True)
    with pytest.raises(MemplanError, match="fake=False"):
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():
            fake_work = SmallNet(2)
        trace(fake_work.step, *fake_work.inputs, fake=False)


def test_model_and_optimizer_found_on_a_bound_step(real_trace):
    work = SmallNet(4)
    tr = trace(work.step, *work.inputs, fake=False)  # no model= / optimizer=: taken from work
    assert _storage_rows(tr) == _storage_rows(real_trace)


def test_cpu_ops_have_no_measured_duration(real_trace):
    assert all(o.duration_s is None for o in real_trace.ops)


def test_trace_file_roundtrip(real_trace, tmp_path):
    write_trace(real_trace, tmp_path / "t.jsonl")
    again = read_trace(tmp_path / "t.jsonl")
    assert again.ops == real_trace.ops and again.meta == json.loads(json.dumps(real_trace.meta))

    def shapeless(tr):  # io drops an empty shape: a scalar's () is read back as None
        return [dataclasses.replace(s, shape=s.shape or None) for s in tr.storages]

    assert shapeless(again) == shapeless(real_trace)
    assert again.digest == real_trace.digest


@pytest.mark.parametrize("name, needle", [("no_such_module_xyz:f", "cannot import"),
                                          ("tests.tracing.test_tracer:no_such_function", "no function"),
                                          ("no_such_model_xyz", "unknown model")])
def test_bad_model_is_a_user_error(name, needle):
    with pytest.raises(MemplanError, match=needle):
        trace_workload(name, 2)


def test_bad_config_is_a_user_error():
    with pytest.raises(MemplanError, match="model small_net with config no_such_option=1: cannot be built"):
        trace_workload(small_net, 2, fake=True, no_such_option=1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_ops_have_measured_durations():
    work = SmallNet(4)
    work.model.cuda()
    work.optimizer = torch.optim.SGD(work.model.parameters(), lr=0.1, momentum=0.9)
    inputs = tuple(t.cuda() for t in work.inputs)
    tr = trace(work.step, *inputs, fake=False)
    timed = [o for o in tr.ops if o.duration_s is not None]
    assert len(timed) == len(tr.ops) and all(o.duration_s >= 0 for o in timed)
    assert tr.meta["device"].startswith("cuda")
    assert _storage_rows(tr)[0][0] > 0


def _same_trace(a, b):
    assert _storage_rows(a) == _storage_rows(b)
    assert _op_rows(a) == _op_rows(b)
    assert a.peak_load_bytes == b.peak_load_bytes and len(a.storages) == len(b.storages)


@pytest.mark.parametrize("name, size", [("vgg11-cifar", 32), ("resnet18-cifar", 8)])
def test_zoo_model_fake_equals_real(name, size):
    fake = trace_workload(name, 2, fake=True, input_size=size)
    _same_trace(fake, trace_workload(name, 2, fake=False, input_size=size))
    assert fake.meta["model"] == name and fake.meta["input_size"] == size


def test_a_model_failing_on_its_input_is_a_user_error():
    with pytest.raises(MemplanError, match="vgg11-cifar.*too small"):
        trace_workload("vgg11-cifar", 2, input_size=8)


@pytest.mark.slow
def test_vgg11_batch4_fake_equals_real():
    fake, real = trace_workload("vgg11", 4, fake=True), trace_workload("vgg11", 4, fake=False)
    _same_trace(fake, real)
    # Parameters of VGG-11 (132.9 M floats), counted independently of the trace.
    from memplan.zoo import get_workload

    params = sum(p.numel() * p.element_size() for p in get_workload("vgg11", 1).model.parameters())
    assert fake.bytes_by_kind()["param"] >= params and fake.bytes_by_kind()["grad"] == params


def test_kinds_without_model_or_optimizer(real_trace):
    work = SmallNet(4)

    def step(x, y):  # a plain function: the tracer cannot see the model or the optimizer
        return work.step(x, y)

    tr = trace(step, *work.inputs, fake=False)
    assert tr.bytes_by_kind() == real_trace.bytes_by_kind()
    assert [s.kind for s in tr.storages if s.persistent] == [s.kind for s in real_trace.storages if s.persistent]
    assert sorted(o.module for o in tr.ops) == sorted(o.module for o in real_trace.ops)
