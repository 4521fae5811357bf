"""A storage's bytes to and from its host region, zero-value compressed when the plan reserved less.

The d2h lane runs `store`, the h2d lane `load`. Nothing waits for the device on the way out: a
compressed copy has a fixed layout (the count of non-zeros, the bitmask, as many values as the
region holds: memplan.exec.compress.compress_into), so the lane never needs the data's size. Once
the copy is done the host reads the count (`fits`): a storage with more non-zeros than the region
holds is copied again whole, into a buffer of its own, before its device memory is freed
(`store_whole`, at the release: memplan.exec.mover).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .compress import Compressed, compress_into, compressible, decompress, raw_bits
from .slab import align_up

log = logging.getLogger(__name__)

COUNT_BYTES = 8  # the int64 count of non-zeros, at the start of a compressed copy


@dataclass(frozen=True, kw_only=True)
class Packed:
    """How a compressed host copy is laid out: the count, the bitmask, then `capacity` values."""

    bits: int  # bytes of the bitmask, after the count
    values_at: int  # where the values start (8-byte aligned)
    capacity: int  # how many values the region holds
    values_dtype: torch.dtype  # their dtype (the integers of the element's width)
    numel: int  # elements of the original tensor


@dataclass(frozen=True, kw_only=True)
class HostCopy:
    """Where a storage's host copy is and how it is laid out."""

    dest: torch.Tensor  # the bytes on the host: the decision's slab region, or a buffer of its own
    overflow: bool  # `dest` is a buffer of its own (the region could not hold the bytes)
    packed: Packed | None = None  # compressed: its layout; None: the raw bytes


def typed_bytes(src: torch.Tensor, dtype: str | None) -> torch.Tensor | None:
    """The bytes as elements of the storage's dtype, when they can be compressed."""
    dt = getattr(torch, dtype, None) if dtype else None
    if not isinstance(dt, torch.dtype) or src.numel() % dt.itemsize:
        return None
    typed = src.view(dt)
    return typed if compressible(typed) else None


def store(src: torch.Tensor, typed: torch.Tensor | None, region: torch.Tensor) -> HostCopy:
    """Start copying the bytes to the host; returns where and how. Compressed (`typed` given) when the
    region is smaller than the bytes and holds at least one value; else raw, into the region or a
    buffer of its own when they do not fit it."""
    layout = _layout(typed, region) if typed is not None and region.numel() < src.numel() else None
    if layout is None:
        return store_whole(src, region)
    packed, count = compress_into(typed, layout.capacity)
    values = packed.values.view(torch.uint8)
    region[:COUNT_BYTES].copy_(count.view(torch.uint8), non_blocking=True)
    region[COUNT_BYTES: COUNT_BYTES + layout.bits].copy_(packed.bits, non_blocking=True)
    region[layout.values_at: layout.values_at + values.numel()].copy_(values, non_blocking=True)
    return HostCopy(dest=region, overflow=False, packed=layout)


def store_whole(src: torch.Tensor, region: torch.Tensor) -> HostCopy:
    """Copy the raw bytes to the region, or to a buffer of their own when they do not fit it."""
    dest = _room(region, src.numel())
    (dest if dest.numel() == src.numel() else dest[: src.numel()]).copy_(src, non_blocking=True)
    return HostCopy(dest=dest, overflow=dest is not region)


def fits(copy: HostCopy) -> bool:
    """Whether a finished host copy holds every byte (a compressed one: every non-zero). Reads the count
    from host memory: call it only once the copy is done."""
    if copy.packed is None:
        return True
    return int(copy.dest[:COUNT_BYTES].numpy().view("int64")[0]) <= copy.packed.capacity


def _layout(typed: torch.Tensor, region: torch.Tensor) -> Packed | None:
    """The compressed layout a region allows (None: not even one value fits)."""
    bits = -(-typed.numel() // 8)
    values_at = align_up(COUNT_BYTES + bits, 8)
    capacity = (region.numel() - values_at) // typed.element_size()
    if capacity <= 0:
        return None
    return Packed(bits=bits, values_at=values_at, capacity=capacity, values_dtype=raw_bits(typed[:0]).dtype,
                  numel=typed.numel())


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
    bits = src[COUNT_BYTES: COUNT_BYTES + packed.bits].to(dst.device, non_blocking=True)
    values = src[packed.values_at: packed.values_at + packed.capacity * width].view(packed.values_dtype)
    out = dst.view(packed.values_dtype)
    decompress(Compressed(bits=bits, values=values.to(dst.device, non_blocking=True), numel=packed.numel), out)
