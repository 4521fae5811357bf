"""A storage's bytes to and from its host region, zero-value compressed when that is smaller.

The d2h lane runs `store`, the h2d lane `load`; the layout `store` returns says where the
copy went (the decision's slab region, or a buffer of its own when the data compresses worse
than the plan's ratio) and how it is laid out (raw, or bitmask then values).
"""

from __future__ import annotations

import logging

import torch

from .compress import Compressed, compress, compressible, decompress
from .slab import ALIGN

log = logging.getLogger(__name__)


def typed_bytes(src: torch.Tensor, dtype: str | None) -> torch.Tensor | None:
    """The bytes as elements of the storage's dtype, when they can be compressed."""
    dt = getattr(torch, dtype, None) if dtype else None
    if not isinstance(dt, torch.dtype) or src.numel() % dt.itemsize:
        return None
    typed = src.view(dt)
    return typed if compressible(typed) else None


def store(src: torch.Tensor, typed: torch.Tensor | None, region: torch.Tensor) -> dict:
    """Copy the bytes to the host, compressed when that is smaller; returns where and how.

    The host copy goes to the decision's region, or, when it does not fit there (the data
    compresses worse than the plan's ratio), to a buffer of its own (`"overflow"`).
    """
    packed = compress(typed) if typed is not None else None
    if packed is not None:
        bits_at = -(-packed.bits.numel() // ALIGN) * ALIGN
        values = packed.values.view(torch.uint8)
        if bits_at + values.numel() < src.numel():
            dest = _room(region, bits_at + values.numel())
            dest[: packed.bits.numel()].copy_(packed.bits, non_blocking=True)
            dest[bits_at: bits_at + values.numel()].copy_(values, non_blocking=True)
            return {"dest": dest, "bits": packed.bits.numel(), "bits_at": bits_at, "nnz": packed.values.numel(),
                    "values_dtype": packed.values.dtype, "numel": packed.numel, "overflow": dest is not region}
    dest = _room(region, src.numel())
    dest[: src.numel()].copy_(src, non_blocking=True)
    return {"dest": dest, "overflow": dest is not region}


def _room(region: torch.Tensor, nbytes: int) -> torch.Tensor:
    """The region, or a host buffer of its own when `nbytes` do not fit in it."""
    if nbytes <= region.numel():
        return region
    log.warning("a compressed host copy needs %d bytes, its region %d: allocated apart", nbytes, region.numel())
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=region.is_pinned())


def load(dst: torch.Tensor, layout: dict) -> None:
    """Copy the host copy back into the storage's bytes (decompressing)."""
    src = layout["dest"]
    if "bits" not in layout:
        dst.copy_(src[: dst.numel()], non_blocking=True)
        return
    width = torch.empty((), dtype=layout["values_dtype"]).element_size()
    bits = src[: layout["bits"]].to(dst.device, non_blocking=True)
    values = src[layout["bits_at"]: layout["bits_at"] + layout["nnz"] * width].view(layout["values_dtype"])
    out = dst.view(layout["values_dtype"])
    decompress(Compressed(bits=bits, values=values.to(dst.device, non_blocking=True), numel=layout["numel"]), out)
