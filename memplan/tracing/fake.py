"""The FakeTensorMode memplan builds and traces models in.

Two things the stock mode does that a user's model should never see:

- `copy.deepcopy` of a fake tensor deep-copies its `fake_mode` too, so a module that clones
  its layers (`nn.TransformerEncoder`, `nn.TransformerDecoder`, any `copy.deepcopy(layer)`)
  ends up with parameters from other modes than its inputs. Torch then either refuses to
  mix them ("fake mode ... doesn't match") or, with non-fake inputs allowed, converts
  every such parameter at each use into a fresh tensor that the tracer sees as an input
  freed mid-step. A mode is a context, not data: copying a tensor must keep it.
- The same `deepcopy` reads the fake tensor's data pointer, and torch warns about that
  on every parameter, which says nothing to the user.
- torch's fake kernel of oneDNN's LSTM layer (`aten.mkldnn_rnn_layer`, what `nn.LSTM` runs
  on the CPU) returns an empty workspace, where the real kernel returns one that autograd
  saves for the backward pass: a fake trace of an LSTM was short by all of them. Its size
  is oneDNN's business (page-aligned, from the shapes alone), so the mode asks the real
  kernel once per shape, on zeros, and gives the fake workspace that size. The probe
  allocates one layer's tensors for a moment; above `PROBE_LIMIT_BYTES` of inputs it is
  skipped with a warning and the workspace stays empty.
"""

from __future__ import annotations

import contextlib
import logging
import warnings

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.utils import _foreach_utils
from torch.utils._pytree import tree_leaves, tree_map

log = logging.getLogger(__name__)

# torch's warning when code reads a FakeTensor's data pointer (Tensor.__deepcopy__ does).
DATA_PTR_WARNING = "Accessing the data pointer of FakeTensor"
PROBE_LIMIT_BYTES = 256 * 2**20  # largest real inputs allocated to size one LSTM workspace
WORKSPACE_OUTPUT = 3  # mkldnn_rnn_layer returns (output, hy, cy, workspace)


class SharedFakeTensorMode(FakeTensorMode):
    """A FakeTensorMode that copies of its tensors keep sharing (see the module docstring)."""

    def __deepcopy__(self, memo):
        return self

    def __copy__(self):
        return self

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs or {})
        if func is torch.ops.aten.mkldnn_rnn_layer.default:
            nbytes = _lstm_workspace_bytes(args, kwargs or {})
            if nbytes:
                workspace = out[WORKSPACE_OUTPUT]
                out = (*out[:WORKSPACE_OUTPUT], workspace.new_empty((nbytes,)), *out[WORKSPACE_OUTPUT + 1:])
        return out


_workspace_sizes: dict[tuple, int] = {}


def _lstm_workspace_bytes(args, kwargs) -> int:
    """Bytes of the workspace the real oneDNN LSTM layer returns for these shapes (0: unknown)."""
    key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else repr(a)
                for a in (*args, *sorted(kwargs.items())))
    if key not in _workspace_sizes:
        inputs = sum(t.numel() * t.element_size() for t in tree_leaves(args) if isinstance(t, torch.Tensor))
        if inputs > PROBE_LIMIT_BYTES:
            log.warning("fake tracing: an LSTM layer with %d bytes of inputs is too large to size its oneDNN "
                        "workspace; the trace leaves it out", inputs)
            _workspace_sizes[key] = 0
        else:
            _workspace_sizes[key] = _probe_workspace(args, kwargs)
    return _workspace_sizes[key]


def _probe_workspace(args, kwargs) -> int:
    def real(value):
        return torch.zeros(value.shape, dtype=value.dtype) if isinstance(value, torch.Tensor) else value

    with unset_fake_temporarily():
        out = torch.ops.aten.mkldnn_rnn_layer.default(*tree_map(real, args), **tree_map(real, kwargs))
        return int(out[WORKSPACE_OUTPUT].untyped_storage().nbytes())


def new_fake_mode() -> FakeTensorMode:
    """The mode models are built and traced in; real constants a model keeps outside its
    parameters are converted, not refused."""
    return SharedFakeTensorMode(allow_non_fake_inputs=True)


@contextlib.contextmanager
def quiet_fake_warnings():
    """Silence torch's FakeTensor data-pointer warning (memplan's business, not the user's)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=DATA_PTR_WARNING)
        yield


@contextlib.contextmanager
def optimizer_as_on_device(optimizer):
    """Let a fake trace's optimizer take the kernels it takes on real tensors of its device.

    torch picks an optimizer's implementation from its parameters' types and devices
    (`_default_to_fused_or_foreach`): real CUDA parameters get the multi-tensor `_foreach_*`
    kernels, but a fake parameter's type is FakeTensor, so a fake trace would record the
    per-parameter loop the real step never runs (other ops, other temporaries). For the
    block, every param group that leaves `foreach` to torch gets the value torch would pick
    for real tensors on the same devices; the groups are put back afterwards.
    """
    supported = set(_foreach_utils._get_foreach_kernels_supported_devices())
    changed = []
    for group in getattr(optimizer, "param_groups", ()):
        if "foreach" not in group or group["foreach"] is not None or group.get("fused") or group.get("differentiable"):
            continue
        devices = {p.device.type for p in group["params"]}
        if devices and devices <= supported:
            group["foreach"] = True
            changed.append(group)
    try:
        yield
    finally:
        for group in changed:
            group["foreach"] = None


@contextlib.contextmanager
def fake_copies(model, optimizer, inputs: tuple):
    """For the block, `model` and `optimizer` hold fake copies of their real tensors.

    Tracing a real model this way allocates nothing on its device: every parameter,
    gradient, buffer and optimizer state entry is replaced by a fake tensor of the same
    shape, dtype, device and aliasing (one fake per real storage, so tied weights stay tied),
    in the same places, so the step function finds them where it looks. The real tensors
    are put back on exit, untouched.

    Yields:
        (mode, fake inputs): the FakeTensorMode to trace in and fake copies of `inputs`.
    """
    mode = new_fake_mode()
    fakes: dict[int, torch.Tensor] = {}

    def fake(t):
        if not isinstance(t, torch.Tensor):
            return t
        if id(t) not in fakes:
            copy = _fake_copy(mode, t.detach())
            fakes[id(t)] = torch.nn.Parameter(copy, requires_grad=t.requires_grad) \
                if isinstance(t, torch.nn.Parameter) else copy
            if t.grad is not None:
                fakes[id(t)].grad = mode.from_tensor(t.grad)
        return fakes[id(t)]

    undo = []
    try:
        for module in model.modules() if model is not None else ():
            for table in (module._parameters, module._buffers):
                for name, t in list(table.items()):
                    if t is not None:
                        undo.append((table, name, t))
                        table[name] = fake(t)
        if optimizer is not None:
            undo.append((optimizer, "state", optimizer.state))
            state = type(optimizer.state)(dict) if hasattr(optimizer.state, "default_factory") else {}
            for p, entries in optimizer.state.items():
                state[fake(p)] = {k: fake(v) for k, v in entries.items()}
            for group in optimizer.param_groups:
                undo.append((group, "params", group["params"]))
                group["params"] = [fake(p) for p in group["params"]]
            optimizer.state = state
        yield mode, tree_map(fake, inputs)
    finally:
        for holder, key, value in reversed(undo):
            if isinstance(holder, dict):
                holder[key] = value
            else:
                setattr(holder, key, value)


def _fake_copy(mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor:
    """A fake copy of `t`; a 0-dim tensor (an optimizer's step count) keeps its value, as
    optimizers read it with `.item()`."""
    if t.dim() == 0:
        return mode.fake_tensor_converter.from_real_tensor(mode, t.clone(), make_constant=True)  # ops on a constant run on it
    return mode.from_tensor(t)
