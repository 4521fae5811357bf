"""Zero-value compression (ZVC): a bitmask of non-zero elements plus the non-zero values.

Runs on the tensor's own device (the GPU, before the copy), so the host link carries and
the slab holds `ceil(n / 8) + nnz * itemsize` bytes instead of `n * itemsize`. Zero is
tested on the raw bits (an integer view), so -0.0 and NaN payloads survive exactly.
`compress_into` fills a fixed number of values and counts the non-zeros on the device, so
neither it nor decompression needs a host synchronisation (positions come from prefix sums).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BITS_PER_BYTE = 8
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True, kw_only=True)
class Compressed:
    """A tensor's contents as bitmask plus non-zero values."""

    bits: torch.Tensor  # uint8, ceil(numel / 8) bytes, bit i of byte j = element 8*j+i is non-zero
    values: torch.Tensor  # the non-zero elements, as integers of the element's width
    numel: int  # number of elements of the original tensor

    @property
    def nbytes(self) -> int:
        """Bytes of the compressed form."""
        return self.bits.numel() + self.values.numel() * self.values.element_size()


def compressible(t: torch.Tensor) -> bool:
    """True when `t`'s dtype can go through ZVC (real element types of 1, 2, 4 or 8 bytes)."""
    return not t.is_complex() and t.element_size() in _INT_OF_SIZE


def raw_bits(t: torch.Tensor) -> torch.Tensor:
    """A flat integer view of `t`'s elements (same bytes), for bit-exact zero tests."""
    flat = t.reshape(-1)
    return flat.view(torch.uint8) if t.dtype == torch.bool else flat.view(_INT_OF_SIZE[t.element_size()])


def compress(t: torch.Tensor) -> Compressed:
    """Compress `t` (any layout; read in row-major element order).

    Note: selecting the non-zeros needs their count on the host, one synchronisation.
    """
    ints = raw_bits(t.contiguous())
    mask = ints != 0
    return Compressed(bits=pack_bits(mask), values=ints[mask], numel=ints.numel())


def compress_into(t: torch.Tensor, capacity: int) -> tuple[Compressed, torch.Tensor]:
    """Compress `t` into `capacity` values with no host synchronisation (every shape is fixed): the
    first `capacity` non-zeros, zeros after them. Also returns the count of non-zeros (a 1-element
    int64 tensor on `t`'s device): more than `capacity` means some were left out."""
    ints = raw_bits(t.contiguous())
    mask = ints != 0
    ranks = torch.cumsum(mask, 0, dtype=torch.int64)  # non-zeros up to and including each position
    wanted = torch.arange(1, capacity + 1, dtype=torch.int64, device=ints.device)
    at = torch.searchsorted(ranks, wanted)  # the position of the j-th non-zero (past the end: none)
    values = torch.cat([ints, ints.new_zeros(1)])[at]
    count = ranks[-1:] if ints.numel() else ranks.new_zeros(1)
    return Compressed(bits=pack_bits(mask), values=values, numel=ints.numel()), count


def decompress(c: Compressed, out: torch.Tensor) -> torch.Tensor:
    """Write the decompressed elements into `out` (row-major element order) and return it."""
    mask = unpack_bits(c.bits, c.numel)
    if c.values.numel() == 0:
        dense = torch.zeros(c.numel, dtype=c.values.dtype, device=mask.device)
    else:
        index = torch.cumsum(mask, 0, dtype=torch.int64).sub_(1).clamp_(min=0)
        dense = torch.where(mask, c.values[index], torch.zeros((), dtype=c.values.dtype, device=mask.device))
    if out.is_contiguous():
        raw_bits(out).copy_(dense)
    else:
        out.copy_(dense.view(out.dtype).view(out.shape))
    return out


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """Pack a flat bool tensor into bytes, least significant bit first."""
    n = mask.numel()
    padded = torch.zeros(-(-n // BITS_PER_BYTE) * BITS_PER_BYTE, dtype=torch.uint8, device=mask.device)
    padded[:n] = mask
    weights = torch.tensor([1 << i for i in range(BITS_PER_BYTE)], dtype=torch.uint8, device=mask.device)
    return (padded.view(-1, BITS_PER_BYTE) * weights).sum(dim=1, dtype=torch.uint8)


def unpack_bits(bits: torch.Tensor, n: int) -> torch.Tensor:
    """The first `n` flags of a packed byte tensor, as bool."""
    shifts = torch.arange(BITS_PER_BYTE, dtype=torch.uint8, device=bits.device)
    return ((bits.unsqueeze(1) >> shifts) & 1).reshape(-1)[:n].bool()


def compressed_bound(numel: int, itemsize: int, nnz: int) -> int:
    """Bytes of the compressed form of a tensor with `nnz` non-zeros."""
    return -(-numel // BITS_PER_BYTE) + nnz * itemsize
