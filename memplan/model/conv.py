"""Convolutions in the trace and in the plan (mu-cuDNN, paper 003).

The tracer records on every 2-D convolution op its geometry (`ConvParams`): forward ops
run the `fwd` kernel, backward ops the `bwd_data` and/or `bwd_filter` kernels (as the
autograd node's output mask asks). A plan may decide, per kernel of such an op, how it
runs (`MicroBatch`): the micro-batch sizes, the algorithm of each, and what that costs
(time, workspace). The simulator charges exactly those numbers (memplan.sim.convview).
"""

from __future__ import annotations

from dataclasses import dataclass

CONV_KERNELS = ("fwd", "bwd_data", "bwd_filter")


def conv_output_size(size: int, kernel: int, pad: int, stride: int, dilation: int) -> int:
    """One spatial dimension of a convolution's output (PyTorch's formula)."""
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


@dataclass(frozen=True, kw_only=True)
class ConvParams:
    """A 2-D convolution as traced: NCHW input, KCRS weight (C per group), and its kernels."""

    kernels: tuple[str, ...]  # what the op computes: ("fwd",), or a subset of ("bwd_data", "bwd_filter")
    n: int  # batch size
    c: int  # input channels
    h: int  # input height
    w: int  # input width
    k: int  # output channels (filters)
    r: int  # filter height
    s: int  # filter width
    pad_h: int = 0  # zero padding, top and bottom
    pad_w: int = 0  # zero padding, left and right
    stride_h: int = 1  # vertical stride
    stride_w: int = 1  # horizontal stride
    dil_h: int = 1  # vertical dilation
    dil_w: int = 1  # horizontal dilation
    groups: int = 1  # channel groups (C and K are both divisible by it)
    dtype: str = "float32"  # torch dtype name of the input

    def __post_init__(self):
        unknown = set(self.kernels) - set(CONV_KERNELS)
        if not self.kernels or unknown:
            raise ValueError(f"conv kernels must be a non-empty subset of {CONV_KERNELS}, got {self.kernels}")
        if min(self.n, self.c, self.h, self.w, self.k, self.r, self.s, self.stride_h, self.stride_w,
               self.dil_h, self.dil_w, self.groups) < 1 or min(self.pad_h, self.pad_w) < 0:
            raise ValueError("conv sizes, strides, dilations and groups must be positive, padding not negative")
        if self.c % self.groups or self.k % self.groups:
            raise ValueError(f"conv channels {self.c} -> {self.k} are not divisible by groups {self.groups}")

    @property
    def out_h(self) -> int:
        """Output height."""
        return conv_output_size(self.h, self.r, self.pad_h, self.stride_h, self.dil_h)

    @property
    def out_w(self) -> int:
        """Output width."""
        return conv_output_size(self.w, self.s, self.pad_w, self.stride_w, self.dil_w)


@dataclass(frozen=True, kw_only=True)
class MicroBatch:
    """How one convolution kernel of one op runs: its micro-batches, their algorithms, the cost.

    Time and memory are the planner's numbers for the configuration (from a benchmark
    database: measured, or the cuDNN family model); the simulator charges them as given.
    """

    op: int  # the convolution op (its ConvParams name the kernel)
    kernel: str  # one of CONV_KERNELS, among the op's kernels
    sizes: tuple[int, ...]  # micro-batch sizes, in order, summing to the op's batch
    algos: tuple[str, ...]  # the algorithm of each micro-batch
    time_s: float  # seconds of the whole kernel: the sum over its micro-batches
    workspace_bytes: int  # the algorithms' workspace: the largest over the micro-batches
    accumulator_bytes: int = 0  # what a split weight gradient holds beside the gradient (memplan.exec.microconv)
    source: str = ""  # where time and workspace come from, e.g. "model:v100", "cpu:<host cpu>"
    module: str = ""  # the op's module, for people reading the plan

    def __post_init__(self):
        if self.kernel not in CONV_KERNELS:
            raise ValueError(f"micro-batch of op {self.op}: kernel {self.kernel!r} is not one of {CONV_KERNELS}")
        if not self.sizes or min(self.sizes) < 1 or len(self.algos) != len(self.sizes):
            raise ValueError(f"micro-batch of op {self.op}: sizes must be positive, one algorithm each")
        if not self.time_s >= 0 or self.workspace_bytes < 0 or self.accumulator_bytes < 0:
            raise ValueError(f"micro-batch of op {self.op}: time and bytes must not be negative")

    @property
    def temp_bytes(self) -> int:
        """Memory the kernel holds while it runs, beside the op's own buffers."""
        return self.workspace_bytes + self.accumulator_bytes


def conv_temps(microbatches) -> tuple[dict[int, float], dict[int, int]]:
    """Per decided op: its seconds (its kernels run one after the other, so times add) and
    its temporary bytes (each kernel frees its workspace before the next: the largest)."""
    seconds: dict[int, float] = {}
    temps: dict[int, int] = {}
    for m in microbatches:
        seconds[m.op] = seconds.get(m.op, 0.0) + m.time_s
        temps[m.op] = max(temps.get(m.op, 0), m.temp_bytes)
    return seconds, temps
