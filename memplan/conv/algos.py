"""The cuDNN convolution algorithm families: which kernels each runs, its workspace, its work.

cuDNN (v7, the paper's) offers per kernel a handful of algorithms whose speed and
workspace differ by orders of magnitude. memplan models seven families by how they lay
the data out; each one's workspace follows from that layout, and its work is the
arithmetic and memory traffic the layout implies. The formulas are ours (cuDNN does not
publish its own); the FFT one reproduces the paper's two published numbers for AlexNet's
conv2 (213 MiB at batch 256, 48.9 MiB at 32: Section IV-A) exactly.

| family | cuDNN algorithms | runs | workspace |
| --- | --- | --- | --- |
| implicit_gemm | FWD_IMPLICIT_GEMM, BWD_DATA_ALGO_0, BWD_FILTER_ALGO_0 | all | none |
| implicit_precomp_gemm | FWD_IMPLICIT_PRECOMP_GEMM, BWD_DATA_ALGO_1, BWD_FILTER_ALGO_1 | all | an index table, 8 B per filter tap (fwd) |
| gemm | FWD_GEMM, BWD_FILTER_ALGO_3 | fwd, bwd_filter | the im2col matrix of the batch: C/g*R*S x N*P*Q elements |
| fft | FWD_FFT, BWD_DATA_FFT, BWD_FILTER_FFT | stride 1, no dilation, padded input <= 256 | every image, filter and output plane in the frequency domain |
| fft_tiling | FWD_FFT_TILING, BWD_DATA_FFT_TILING, BWD_FILTER_FFT_TILING | stride 1, no dilation, filter <= 32 | the same on 32x32 tiles |
| winograd | FWD_WINOGRAD, BWD_DATA_WINOGRAD | 3x3, stride 1, no dilation; not bwd_filter | the transformed filters, 4x4 each |
| winograd_nonfused | FWD/BWD_DATA/BWD_FILTER_WINOGRAD_NONFUSED | 3x3 or 5x5, stride 1, no dilation | transformed input, filter and output tiles (6x6) |

Groups are convolved one at a time (as the paper's Caffe did), so channel counts in the
formulas are per group. FFT planes are complex64 over a Hf x (Wf/2+1) half-spectrum,
Hf and Wf the padded input rounded up to a product of 2, 3, 5 and 7.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .kernels import Kernel

FAMILIES = ("implicit_gemm", "implicit_precomp_gemm", "gemm", "fft", "fft_tiling", "winograd", "winograd_nonfused")
COMPLEX_BYTES = 8  # complex64: FFT planes are single precision
INDEX_BYTES = 8  # one precomputed offset per filter tap
FFT_MAX_SIZE = 256  # cuDNN's FFT needs the padded input at most this large
FFT_TILE = 32  # FFT_TILING's tile side
FFT_FLOPS_PER_POINT = 2.5  # a real-to-complex FFT of n points costs about 2.5 n log2 n flops
COMPLEX_MAC_FLOPS = 8  # one complex multiply-add
WINOGRAD_FUSED_TILE = 4  # F(2x2, 3x3): 4x4 input tiles, 16 multiplies per 2x2 outputs
WINOGRAD_TILE = 6  # the non-fused F(4x4, 3x3) and F(2x2, 5x5): 6x6 input tiles
_FFT_RADICES = (2, 3, 5, 7)


@dataclass(frozen=True)
class Work:
    """What an algorithm does for one kernel: arithmetic and memory traffic."""

    flops: float  # floating point operations it executes
    bytes: float  # bytes it moves through device memory (tensors plus its workspace, written then read)


def supports(family: str, kernel: Kernel) -> bool:
    """True when `family` can compute `kernel` (cuDNN's restrictions, as modelled)."""
    plain = kernel.stride_h == kernel.stride_w == 1 and kernel.dil_h == kernel.dil_w == 1
    if family in ("implicit_gemm", "implicit_precomp_gemm"):
        return True
    if family == "gemm":
        return kernel.kind != "bwd_data"
    if family == "fft":
        return plain and max(_padded(kernel)) <= FFT_MAX_SIZE
    if family == "fft_tiling":
        return plain and max(kernel.r, kernel.s) <= FFT_TILE // 2
    if family == "winograd":
        return plain and kernel.kind != "bwd_filter" and kernel.r == kernel.s == 3
    if family == "winograd_nonfused":
        return plain and kernel.r == kernel.s and kernel.r in (3, 5)
    raise ValueError(f"unknown algorithm family {family!r}; known: {', '.join(FAMILIES)}")


def families_for(kernel: Kernel) -> tuple[str, ...]:
    """The families that can compute `kernel`, in FAMILIES order."""
    return tuple(f for f in FAMILIES if supports(f, kernel))


def workspace_bytes(family: str, kernel: Kernel) -> int:
    """The workspace `family` needs for `kernel` (see the module's table)."""
    cg, kg, n, e = kernel.c // kernel.groups, kernel.k // kernel.groups, kernel.n, kernel.element_bytes
    if family == "implicit_gemm":
        return 0
    if family == "implicit_precomp_gemm":
        return INDEX_BYTES * cg * kernel.r * kernel.s if kernel.kind == "fwd" else 0
    if family == "gemm":
        return e * cg * kernel.r * kernel.s * n * kernel.out_h * kernel.out_w
    if family == "fft":
        return COMPLEX_BYTES * _spectrum(*_fft_size(kernel)) * (n * cg + kg * cg + n * kg)
    if family == "fft_tiling":
        tiles = _tiles(kernel, FFT_TILE - kernel.r + 1, FFT_TILE - kernel.s + 1)
        return COMPLEX_BYTES * _spectrum(FFT_TILE, FFT_TILE) * (n * cg * tiles + kg * cg + n * kg * tiles)
    if family == "winograd":
        return e * WINOGRAD_FUSED_TILE ** 2 * kg * cg
    if family == "winograd_nonfused":
        m = WINOGRAD_TILE - kernel.r + 1
        tiles = _tiles(kernel, m, m)
        return e * WINOGRAD_TILE ** 2 * (n * cg * tiles + kg * cg + n * kg * tiles)
    raise ValueError(f"unknown algorithm family {family!r}; known: {', '.join(FAMILIES)}")


def work(family: str, kernel: Kernel) -> Work:
    """Arithmetic and traffic of `family` on `kernel`: what the time model prices."""
    base = kernel.tensor_bytes
    staged = base + 2 * workspace_bytes(family, kernel)  # a workspace is written, then read
    cg, kg, n = kernel.c // kernel.groups, kernel.k // kernel.groups, kernel.n
    if family in ("implicit_gemm", "implicit_precomp_gemm"):
        return Work(kernel.flops, base)
    if family == "gemm":
        return Work(kernel.flops, staged)
    if family in ("fft", "fft_tiling"):
        hf, wf = _fft_size(kernel) if family == "fft" else (FFT_TILE, FFT_TILE)
        tiles = 1 if family == "fft" else _tiles(kernel, FFT_TILE - kernel.r + 1, FFT_TILE - kernel.s + 1)
        planes = (n * cg + n * kg) * tiles + kg * cg
        transforms = planes * FFT_FLOPS_PER_POINT * hf * wf * math.log2(hf * wf)
        products = COMPLEX_MAC_FLOPS * n * kg * cg * tiles * _spectrum(hf, wf)
        return Work((transforms + products) * kernel.groups, staged)
    if family == "winograd":
        # F(2x2, 3x3): 16 multiplies where the direct method needs 36
        return Work(kernel.flops * WINOGRAD_FUSED_TILE ** 2 / (4 * kernel.r * kernel.s), base)
    if family == "winograd_nonfused":
        m = WINOGRAD_TILE - kernel.r + 1
        return Work(kernel.flops * WINOGRAD_TILE ** 2 / (m * m * kernel.r * kernel.s), staged)
    raise ValueError(f"unknown algorithm family {family!r}; known: {', '.join(FAMILIES)}")


def _padded(kernel: Kernel) -> tuple[int, int]:
    return kernel.h + 2 * kernel.pad_h, kernel.w + 2 * kernel.pad_w


def _fft_size(kernel: Kernel) -> tuple[int, int]:
    hp, wp = _padded(kernel)
    return _smooth(hp), _smooth(wp)


def _smooth(n: int) -> int:
    """The smallest m >= n whose prime factors are all 2, 3, 5 or 7 (fast FFT sizes)."""
    m = n
    while True:
        rest = m
        for p in _FFT_RADICES:
            while rest % p == 0:
                rest //= p
        if rest == 1:
            return m
        m += 1


def _spectrum(hf: int, wf: int) -> int:
    """Complex points of a real 2-D FFT's half-spectrum."""
    return hf * (wf // 2 + 1)


def _tiles(kernel: Kernel, step_h: int, step_w: int) -> int:
    """Output tiles of `step_h` x `step_w` covering the output."""
    return math.ceil(kernel.out_h / step_h) * math.ceil(kernel.out_w / step_w)
