"""Convolution kernels: what one cuDNN call computes, and the kernels of a trace.

A kernel is one of the three convolution computations (`fwd`, `bwd_data`, `bwd_filter`)
on one geometry and batch size. Layers of equal shape share their kernels, so benchmarks
and per-kernel optimisations are done once per distinct kernel (mu-cuDNN's cache).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace

from ..errors import MemplanError
from ..model import CONV_KERNELS, ConvParams, Trace

# Bytes per element of the dtypes convolutions run in.
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
# The fields that name a kernel's shape: all but the batch (benchmark rows key on these).
# Sizes and steps that are at least 1 (padding may be 0).
_AT_LEAST_ONE = ("n", "c", "h", "w", "k", "r", "s", "stride_h", "stride_w", "dil_h", "dil_w", "groups")
SHAPE_FIELDS = ("kind", "c", "h", "w", "k", "r", "s", "pad_h", "pad_w", "stride_h", "stride_w", "dil_h", "dil_w",
                "groups", "dtype")


@dataclass(frozen=True, kw_only=True, order=True)
class Kernel(ConvParams):
    """One convolution computation: a traced convolution's geometry and batch (`ConvParams`: NCHW
    input, KCRS weight, its output `out_h` x `out_w`) running one kernel, `kind`."""

    kernels: tuple[str, ...] = ()  # (kind,): set from `kind` (the kernels a ConvParams runs)
    kind: str  # one of CONV_KERNELS

    def __post_init__(self):
        object.__setattr__(self, "kernels", (self.kind,))
        if self.kind not in CONV_KERNELS:
            raise ValueError(f"kernel kind {self.kind!r} is not one of {CONV_KERNELS}")
        if self.dtype not in ELEMENT_BYTES:
            raise ValueError(f"kernel dtype {self.dtype!r} is not one of {sorted(ELEMENT_BYTES)}")
        small = [name for name in _AT_LEAST_ONE if getattr(self, name) < 1] + \
            [name for name in ("pad_h", "pad_w") if getattr(self, name) < 0]
        if small:  # ConvParams refuses these too; a kernel typed by hand is told which field
            raise ValueError(f"{small[0]} must be at least {0 if small[0].startswith('pad') else 1}")
        super().__post_init__()
        if self.out_h < 1 or self.out_w < 1:
            raise ValueError(f"a {self.r}x{self.s} filter leaves no output of a {self.h}x{self.w} input")

    @classmethod
    def of(cls, conv: ConvParams, kind: str) -> Kernel:
        """The `kind` kernel of a traced convolution."""
        return cls(kind=kind, **{f.name: getattr(conv, f.name) for f in fields(ConvParams) if f.name != "kernels"})

    def with_batch(self, n: int) -> Kernel:
        """The same kernel on `n` samples."""
        return replace(self, n=n)

    @property
    def shape(self) -> tuple:
        """Everything but the batch: equal for layers of equal shape."""
        return tuple(getattr(self, name) for name in SHAPE_FIELDS)

    @property
    def element_bytes(self) -> int:
        """Bytes per element."""
        return ELEMENT_BYTES[self.dtype]

    @property
    def weight_bytes(self) -> int:
        """Bytes of the filter (and of its gradient)."""
        return self.k * (self.c // self.groups) * self.r * self.s * self.element_bytes

    @property
    def flops(self) -> float:
        """Multiply-adds (x2) of the direct convolution: the same for the three kinds."""
        return 2.0 * self.n * self.k * (self.c // self.groups) * self.r * self.s * self.out_h * self.out_w

    @property
    def tensor_bytes(self) -> float:
        """Bytes of input, filter and output: what any algorithm reads or writes at least."""
        e = self.element_bytes
        return e * (self.n * self.c * self.h * self.w + self.n * self.k * self.out_h * self.out_w) + self.weight_bytes

    def describe(self) -> str:
        """A short readable name, e.g. `fwd n64 c96x27x27 k256 5x5 p2 s1`."""
        pad = f"p{self.pad_h}" if self.pad_h == self.pad_w else f"p{self.pad_h}x{self.pad_w}"
        stride = f"s{self.stride_h}" if self.stride_h == self.stride_w else f"s{self.stride_h}x{self.stride_w}"
        dil = f"d{self.dil_h}" if self.dil_h == self.dil_w else f"d{self.dil_h}x{self.dil_w}"
        extra = (f" {dil}" if max(self.dil_h, self.dil_w) > 1 else "") + \
            (f" g{self.groups}" if self.groups > 1 else "") + ("" if self.dtype == "float32" else f" {self.dtype}")
        return f"{self.kind} n{self.n} c{self.c}x{self.h}x{self.w} k{self.k} {self.r}x{self.s} {pad} {stride}{extra}"


_PAIR = r"(\d+)(?:x(\d+))?"
_DESCRIBED = re.compile(rf"^(?P<kind>\w+) n(?P<n>\d+) c(?P<c>\d+)x(?P<h>\d+)x(?P<w>\d+) k(?P<k>\d+) "
                        rf"(?P<r>\d+)x(?P<s>\d+)(?: p{_PAIR})?(?: s{_PAIR})?(?: d{_PAIR})?(?: g(?P<g>\d+))?"
                        rf"(?: (?P<dtype>[a-z]+\d+))?$")


def parse_kernel(text: str) -> Kernel:
    """The kernel `Kernel.describe()` names, e.g. "fwd n64 c96x27x27 k256 5x5 p2 s1".

    Raises:
        MemplanError: text that names no kernel (one line, with the expected form).
    """
    m = _DESCRIBED.match(" ".join(str(text).split()))
    if m is None:
        raise MemplanError(f"not a convolution kernel: {text!r} (expected e.g. 'fwd n64 c96x27x27 k256 5x5 p2 s1', "
                           f"kinds {', '.join(CONV_KERNELS)})")
    g = m.groups()
    pairs = [(int(a or default), int(b or a or default)) for a, b, default in
             ((g[8], g[9], 0), (g[10], g[11], 1), (g[12], g[13], 1))]
    try:
        return Kernel(kind=m["kind"], n=int(m["n"]), c=int(m["c"]), h=int(m["h"]), w=int(m["w"]), k=int(m["k"]),
                      r=int(m["r"]), s=int(m["s"]), pad_h=pairs[0][0], pad_w=pairs[0][1], stride_h=pairs[1][0],
                      stride_w=pairs[1][1], dil_h=pairs[2][0], dil_w=pairs[2][1], groups=int(m["g"] or 1),
                      dtype=m["dtype"] or "float32")
    except ValueError as exc:
        raise MemplanError(f"not a convolution kernel: {text!r} ({exc})") from None


@dataclass(frozen=True, kw_only=True)
class TraceKernel:
    """One kernel of one convolution op of a trace."""

    op: int  # op index
    module: str  # the op's module
    kernel: Kernel  # what it computes, at the op's batch


def trace_kernels(trace: Trace) -> list[TraceKernel]:
    """Every kernel of every convolution op of `trace`, in op order."""
    return [TraceKernel(op=op.index, module=op.module, kernel=Kernel.of(op.conv, kind))
            for op in trace.ops if op.conv is not None for kind in op.conv.kernels]
