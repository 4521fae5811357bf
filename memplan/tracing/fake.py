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
