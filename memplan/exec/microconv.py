"""Micro-batched convolution (mu-cuDNN, paper 003): a convolution's batch split as the plan says.

Forward and data-gradient micro-batches write straight into their slice of the op's
output (`aten.convolution.out`; the data gradient of a slice is the transposed
convolution of its output gradient), so they hold nothing extra. Weight-gradient
micro-batches are summed: the first one becomes the gradient, each later one is added
from a buffer of the weight's size; for 16-bit types the running sum is kept in fp32 and
rounded once at the end. What that holds beside the gradient is the plan's
`accumulator_bytes` (memplan.conv.options.accumulator_bytes; cuDNN's beta=1 would need
none, PyTorch offers no such call). The bias gradient is one
reduction of the whole output gradient. Each kernel of a backward op is split on its own.

NOTE where the split happens. Under a plan the executor does not swap modules: a swapped
module would run other aten ops (slices, several convolutions) than the traced step, and
the step program is counted op by op against the trace. Instead the executor runs the
traced convolution op itself split (`run`, called by memplan.exec.interpreted at a decided op,
and by the replayer when a recomputation replays one): one traced op in, its outputs out,
nothing else changes. Without the executor, `MicroBatchConv2d` (an nn.Conv2d whose forward
and backward are the same split kernels, through an autograd Function) can be swapped in
with `use_microbatches(model, trace, plan)`; a trace of such a model records the split
ops themselves.

Results equal the undivided convolution within float rounding (per-sample results are
the same computation; weight and bias gradients are summed in another order).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from ..model import conv_output_size

log = logging.getLogger(__name__)

aten = torch.ops.aten
FORWARD, BACKWARD = "aten::convolution", "aten::convolution_backward"
_SAMPLE_DIMS = [0, 2, 3]  # the bias gradient sums the output gradient over batch and space


def run(func, args: tuple, kwargs: dict, split: dict[str, tuple[int, ...]]):
    """Run a traced convolution op with its kernels split into micro-batches.

    Args:
        func: aten.convolution.default or aten.convolution_backward.default.
        args, kwargs: the call (positional, as autograd makes it).
        split: per kernel ("fwd", "bwd_data", "bwd_filter"), the micro-batch sizes.
    Returns:
        What `func(*args)` returns.
    """
    name = func._schema.name
    if kwargs or name not in (FORWARD, BACKWARD) or func._overloadname != "default":
        log.warning("%s with keyword arguments cannot be split: it runs whole", func)
        return func(*args, **kwargs)
    if name == FORWARD:
        return forward(*args, sizes=split.get("fwd"))
    return backward(*args, data_sizes=split.get("bwd_data"), filter_sizes=split.get("bwd_filter"))


def forward(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups, *, sizes=None):
    """aten.convolution over micro-batches of `sizes` (None or one size: undivided)."""
    geometry = (stride, padding, dilation, transposed, output_padding, groups)
    if not sizes or len(sizes) == 1 or transposed:
        return aten.convolution.default(x, weight, bias, *geometry)
    out_hw = [conv_output_size(x.shape[2 + d], weight.shape[2 + d], padding[d], stride[d], dilation[d])
              for d in range(2)]
    out = torch.empty((x.shape[0], weight.shape[0], *out_hw), dtype=x.dtype, device=x.device, memory_format=_layout(x))
    for start, size in _slices(sizes):
        aten.convolution.out(x.narrow(0, start, size), weight, bias, *geometry, out=out.narrow(0, start, size))
    return out


def backward(grad_out, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask, *,
             data_sizes=None, filter_sizes=None):
    """aten.convolution_backward with the data and weight gradients split as given."""
    geometry = (stride, padding, dilation, transposed, output_padding, groups)
    whole = (not data_sizes or len(data_sizes) == 1 or not mask[0]) and \
        (not filter_sizes or len(filter_sizes) == 1 or not mask[1])
    if whole or transposed:
        return aten.convolution_backward.default(grad_out, x, weight, bias_sizes, *geometry, mask)
    grad_x = _data_grad(grad_out, x, weight, geometry, data_sizes) if mask[0] else None
    grad_w = _filter_grad(grad_out, x, weight, geometry, filter_sizes) if mask[1] else None
    grad_b = aten.sum.dim_IntList(grad_out, _SAMPLE_DIMS) if mask[2] else None
    return grad_x, grad_w, grad_b


def _data_grad(grad_out, x, weight, geometry, sizes):
    """The input's gradient, each micro-batch a transposed convolution into its slice."""
    if not sizes or len(sizes) == 1:
        return aten.convolution_backward.default(grad_out, x, weight, None, *geometry, [True, False, False])[0]
    stride, padding, dilation, _, _, groups = geometry
    grad_x = torch.empty_like(x, memory_format=_layout(x))
    # the transposed convolution's output_padding that gives back the input's exact size
    extra = [x.shape[2 + d] - ((grad_out.shape[2 + d] - 1) * stride[d] - 2 * padding[d]
                               + dilation[d] * (weight.shape[2 + d] - 1) + 1) for d in range(2)]
    for start, size in _slices(sizes):
        aten.convolution.out(grad_out.narrow(0, start, size), weight, None, stride, padding, dilation, True, extra,
                             groups, out=grad_x.narrow(0, start, size))
    return grad_x


def _filter_grad(grad_out, x, weight, geometry, sizes):
    """The weight's gradient: micro-batch gradients summed (in fp32 for 16-bit types)."""
    mask = [False, True, False]
    total = None
    for start, size in _slices(sizes or (x.shape[0],)):
        part = aten.convolution_backward.default(grad_out.narrow(0, start, size), x.narrow(0, start, size), weight,
                                                 None, *geometry, mask)[1]
        if total is None:
            total = part if part.element_size() >= 4 else part.float()
        else:
            total.add_(part)
        del part
    return total if total.dtype == weight.dtype else total.to(weight.dtype)


def _slices(sizes):
    start = 0
    for size in sizes:
        yield start, int(size)
        start += int(size)


def _layout(t: torch.Tensor) -> torch.memory_format:
    return torch.channels_last if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) \
        and not t.is_contiguous() else torch.contiguous_format


# --- without the executor: a module to swap in ------------------------------------------------------


class _MicroBatchConv2dFunction(torch.autograd.Function):
    """The split kernels as one autograd node: forward `forward`, backward `backward`."""

    @staticmethod
    def forward(ctx, x, weight, bias, geometry, split):
        ctx.save_for_backward(x, weight)
        ctx.geometry, ctx.split, ctx.has_bias = geometry, split, bias is not None
        return forward(x, weight, bias, *geometry, sizes=split.get("fwd"))

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        bias_sizes = [weight.shape[0]] if ctx.has_bias else None
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
        grads = backward(grad_out.contiguous(), x, weight, bias_sizes, *ctx.geometry, mask,
                         data_sizes=ctx.split.get("bwd_data"), filter_sizes=ctx.split.get("bwd_filter"))
        return (*grads, None, None)


class MicroBatchConv2d(nn.Conv2d):
    """An nn.Conv2d (numeric zero padding) that runs each kernel split into micro-batches.

    Make one with `MicroBatchConv2d.wrapping(conv, split)`: it shares the module's parameters,
    buffers and hooks; `split` gives per kernel ("fwd", "bwd_data", "bwd_filter") the sizes.
    """

    split: dict

    @classmethod
    def wrapping(cls, conv: nn.Conv2d, split: dict[str, tuple[int, ...]]) -> MicroBatchConv2d:
        """`conv` running split as `split` says (its state dicts are shared, not copied)."""
        if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise ValueError("MicroBatchConv2d needs numeric zero padding")
        new = cls.__new__(cls)
        new.__dict__.update(conv.__dict__)
        new.split = dict(split)
        return new

    def forward(self, x):
        geometry = (list(self.stride), list(self.padding), list(self.dilation), False, [0, 0], self.groups)
        return _MicroBatchConv2dFunction.apply(x, self.weight, self.bias, geometry, self.split)


def use_microbatches(model: nn.Module, trace, plan) -> int:
    """Swap every nn.Conv2d the plan splits for a MicroBatchConv2d sharing its parameters.

    Each module takes the splits of the first traced ops it owns (a module called twice per
    step gets its first call's). Returns how many modules were swapped.
    """
    splits: dict[str, dict[str, tuple[int, ...]]] = {}
    for m in plan.microbatches:
        splits.setdefault(trace.ops[m.op].module, {}).setdefault(m.kernel, m.sizes)
    swapped = 0
    for name, split in splits.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        conv = getattr(parent, child, None)
        if type(conv) is nn.Conv2d and any(len(s) > 1 for s in split.values()):
            setattr(parent, child, MicroBatchConv2d.wrapping(conv, split))
            swapped += 1
    return swapped
