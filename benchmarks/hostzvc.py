"""Zero-value compression of offloaded data on the host, on N threads (paper 001 §IV-C), as
benchmarks/vdnn.py measures it.

vDNN++ compresses an offloaded layer in pinned memory with the CPU cores the training
leaves idle: the tensor is cut into `threads` equal parts, each compressed by its own
thread into a bitmask of its non-zero elements plus those elements (numpy releases the
GIL, so the parts run in parallel). Decompression writes every part back in place.
Elements are compared as raw bits, so -0.0 and NaN payloads survive bit-exactly.

The executor does not run this: it compresses on the tensor's own device before the copy
(memplan.exec.compress, the same format per part but packed least significant bit first), so
the link carries the compressed bytes too. This is the paper's host-side form, kept beside the
benchmark that measures its throughput per thread count.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

_BITS_OF = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}  # raw view per item size


@dataclass(frozen=True, kw_only=True)
class Part:
    """One thread's share: which elements were non-zero, and their values."""

    bits: np.ndarray  # np.packbits of the non-zero mask
    values: np.ndarray  # the non-zero elements, raw bits
    numel: int  # elements in the part


@dataclass(frozen=True, kw_only=True)
class HostCompressed:
    """A compressed array: its parts in order, and what it was."""

    parts: tuple[Part, ...]  # one per thread
    dtype: np.dtype  # the original dtype
    shape: tuple[int, ...]  # the original shape

    @property
    def nbytes(self) -> int:
        """Bytes of the compressed form (bitmasks plus values)."""
        return sum(p.bits.nbytes + p.values.nbytes for p in self.parts)


def _raw(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(_BITS_OF[a.dtype.itemsize])


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, n, max(1, parts) + 1).astype(np.int64)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def _compress_part(raw: np.ndarray) -> Part:
    mask = raw != 0
    return Part(bits=np.packbits(mask), values=raw[mask], numel=raw.size)


def _decompress_part(part: Part, out: np.ndarray) -> None:
    mask = np.unpackbits(part.bits, count=part.numel).astype(np.bool_)
    out[:] = 0
    out[mask] = part.values


def compress(a: np.ndarray, threads: int = 1, pool: ThreadPoolExecutor | None = None) -> HostCompressed:
    """Compress `a` on `threads` threads (a given `pool` is reused; otherwise one is made)."""
    raw = _raw(a)
    slices = [raw[lo:hi] for lo, hi in _split(raw.size, threads)]
    parts = _map(_compress_part, slices, threads, pool)
    return HostCompressed(parts=tuple(parts), dtype=a.dtype, shape=a.shape)


def decompress(c: HostCompressed, threads: int = 1, pool: ThreadPoolExecutor | None = None) -> np.ndarray:
    """The array `c` was made from, bit for bit."""
    out = np.empty(c.shape, dtype=c.dtype)
    raw, lo = _raw(out), 0
    views = []
    for part in c.parts:
        views.append(raw[lo:lo + part.numel])
        lo += part.numel
    _map(lambda pv: _decompress_part(*pv), list(zip(c.parts, views)), threads, pool)
    return out


def _map(fn, items: list, threads: int, pool: ThreadPoolExecutor | None) -> list:
    if threads <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    if pool is not None:
        return list(pool.map(fn, items))
    with ThreadPoolExecutor(max_workers=threads) as own:
        return list(own.map(fn, items))


def density(a: np.ndarray) -> float:
    """Share of non-zero elements (the paper's "activation density")."""
    return float(np.count_nonzero(_raw(a))) / max(a.size, 1)
