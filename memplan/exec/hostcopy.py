"""A storage's bytes to and from its host region, zero-value compressed when that is smaller.

The d2h lane runs `store`, the h2d lane `load`; the layout `store` returns says where the
copy went (the decision's slab region, or a buffer of its own when the data compresses worse
than the plan's ratio) and how it is laid out (raw, or bitmask then values).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .compress import Compressed, compress, compressible, decompress
from .slab import ALIGN

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Packed:
    """How a compressed host copy is laid out: the bitmask, then the non-zero values."""

    bits: int  # bytes of the bitmask, at the start of `dest`
    bits_at: int  # where the values start (the bitmask's bytes rounded up to the slab's alignment)
    nnz: int  # how many values
    values_dtype: torch.dtype  # their dtype
    numel: int  # elements of the original tensor


@dataclass(frozen=True, kw_only=True)
class HostCopy:
    """Where a storage's host copy is and how it is laid out."""

    dest: torch.Tensor  # the bytes on the host: the decision's slab region, or a buffer of its own
    overflow: bool  # `dest` is a buffer of its own (the data compressed worse than the plan's ratio)
    packed: Packed | None = None  # compressed: its layout; None: the raw bytes


def typed_bytes(src: torch.Tensor, dtype: str | None) -> torch.Tensor | None:
    """The bytes as elements of the storage's dtype, when they can be compressed."""
    dt = getattr(torch, dtype, None) if dtype else None
    if not isinstance(dt, torch.dtype) or src.numel() % dt.itemsize:
        return None
    typed = src.view(dt)
    return typed if compressible(typed) else None


def store(src: torch.Tensor, typed: torch.Tensor | None, region: torch.Tensor) -> HostCopy:
    """Copy the bytes to the host, compressed when that is smaller; returns where and how.

    The host copy goes to the decision's region, or, when it does not fit there (the data
    compresses worse than the plan's ratio), to a buffer of its own (`overflow`).
    """
    packed = compress(typed) if typed is not None else None
    if packed is not None:
        bits_at = -(-packed.bits.numel() // ALIGN) * ALIGN
        values = packed.values.view(torch.uint8)
        if bits_at + values.numel() < src.numel():
            dest = _room(region, bits_at + values.numel())
            dest[: packed.bits.numel()].copy_(packed.bits, non_blocking=True)
            dest[bits_at: bits_at + values.numel()].copy_(values, non_blocking=True)
            layout = Packed(bits=packed.bits.numel(), bits_at=bits_at, nnz=packed.values.numel(),
                            values_dtype=packed.values.dtype, numel=packed.numel)
            return HostCopy(dest=dest, overflow=dest is not region, packed=layout)
    dest = _room(region, src.numel())
    (dest if dest.numel() == src.numel() else dest[: src.numel()]).copy_(src, non_blocking=True)
    return HostCopy(dest=dest, overflow=dest is not region)


def _room(region: torch.Tensor, nbytes: int) -> torch.Tensor:
    """The region, or a host buffer of its own when `nbytes` do not fit in it."""
    if nbytes <= region.numel():
        return region
    log.warning("a compressed host copy needs %d bytes, its region %d: allocated apart", nbytes, region.numel())
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=region.is_pinned())


def load(dst: torch.Tensor, copy: HostCopy) -> None:
    """Copy the host copy back into the storage's bytes (decompressing)."""
    src, packed = copy.dest, copy.packed
    if packed is None:
        dst.copy_(src if src.numel() == dst.numel() else src[: dst.numel()], non_blocking=True)
        return
    width = torch.empty((), dtype=packed.values_dtype).element_size()
    bits = src[: packed.bits].to(dst.device, non_blocking=True)
    values = src[packed.bits_at: packed.bits_at + packed.nnz * width].view(packed.values_dtype)
    out = dst.view(packed.values_dtype)
    decompress(Compressed(bits=bits, values=values.to(dst.device, non_blocking=True), numel=packed.numel), out)
