"""What a GPU adds to the memory a dispatch-level trace sees, put back into the trace.

A trace counts every storage at its byte size. On a CUDA device the caching allocator's
counters (what runs out) see more (measured on an H100, `benchmarks/gpu_unseen.py`):

- rounding: every block is at least 512 bytes and a multiple of 512 (memplan.model.blocks);
- library workspaces held for the whole run: cuBLAS keeps one workspace per (handle, stream),
  and autograd runs the backward pass on its own thread, whose handle is another one, so a
  step with matrix products in both passes holds two (32 MiB each on Hopper and newer,
  `CUBLAS_WORKSPACE_CONFIG` overrides);
- memory an op allocates inside itself and frees before it returns: cuDNN convolution
  workspaces (up to 300 MiB per op on resnet50 at batch 64), reductions' staging buffers
  (24-32 MiB), attention kernels' scratch. No rule gives these; they are measured per op
  (memplan.workflows.unseen) and given here.

`device_view` returns the trace as the allocator would count it: storages rounded, the
held workspaces as persistent storages nobody touches, and every op's inner memory as a
storage the op writes and frees when it ends ([op, op+1), as memplan.sim.convview models a
convolution's workspace). Storage ids and op indices of the trace are kept; new storages
come after them, and planners never move them (no gaps, kind `workspace`).
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

from ..model import Storage, Trace
from ..model.blocks import MIN_BLOCK, allocated_size

__all__ = ["MIN_BLOCK", "allocated_size", "cublas_handles", "cublas_workspace_bytes", "device_view"]

KIB, MIB = 1024, 1024 * 1024
HOPPER_MAJOR = 9  # compute capability from which cuBLAS wants 32 MiB of workspace
CUBLAS_HOPPER_BYTES = 32 * MIB  # ":4096:8"
CUBLAS_DEFAULT_CONFIG = ":4096:2:16:8"  # PyTorch's default before Hopper (8 MiB + 128 KiB)
WORKSPACE_KIND = "workspace"
MATMUL_OPS = ("aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.", "aten._addmm_activation.")


def cublas_workspace_bytes(major: int, config: str | None = None) -> int:
    """Bytes of one cuBLAS workspace: `CUBLAS_WORKSPACE_CONFIG` (":SIZE_KIB:COUNT" pairs)
    when set, else PyTorch's default for a device of compute capability `major`."""
    config = config if config is not None else os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if not config:
        if major >= HOPPER_MAJOR:
            return CUBLAS_HOPPER_BYTES
        config = CUBLAS_DEFAULT_CONFIG
    pairs = re.findall(r":(\d+):(\d+)", config)
    return sum(int(size) * KIB * int(count) for size, count in pairs)


def cublas_handles(trace: Trace) -> int:
    """cuBLAS handles a CUDA step uses: one per thread that runs matrix products (the caller's
    thread for the forward pass and the optimizer, autograd's device thread for backward)."""
    return len({op.phase == "backward" for op in trace.ops if op.name.startswith(MATMUL_OPS)})


def device_view(trace: Trace, *, held: dict[str, int] | None = None, inner: dict[int, int] | None = None,
                rounded: bool = True) -> Trace:
    """`trace` as a CUDA device's caching allocator counts it.

    Args:
        trace: the traced iteration.
        held: name -> bytes held for the whole step by libraries (e.g. cuBLAS workspaces).
        inner: op index -> bytes the op allocates inside itself and frees before it returns.
        rounded: round every storage to the allocator's block size.
    Returns:
        The view (the trace itself when there is nothing to add); `meta["device_memory"]` says
        what was added.
    """
    held, inner = dict(held or {}), {op: b for op, b in (inner or {}).items() if b > 0}
    if not (held or inner or rounded):
        return trace
    storages = [replace(s, nbytes=allocated_size(s.nbytes)) if rounded else s for s in trace.storages]
    ops = list(trace.ops)
    n = len(ops)
    for name, nbytes in sorted(held.items()):
        storages.append(Storage(id=len(storages), nbytes=allocated_size(nbytes), kind=WORKSPACE_KIND, alloc_op=0,
                                free_op=n, persistent=True, name=name))
    for op in sorted(inner):
        sid = len(storages)
        storages.append(Storage(id=sid, nbytes=allocated_size(inner[op]), kind=WORKSPACE_KIND, alloc_op=op,
                                free_op=op + 1, name=f"inside op {op}"))
        ops[op] = replace(ops[op], writes=ops[op].writes + (sid,))
    meta = {**trace.meta, "device_memory": {"rounded_to": MIN_BLOCK if rounded else 1, "held": held,
                                             "inner_ops": len(inner), "inner_bytes_max": max(inner.values(), default=0)}}
    # everything else of the trace stays: without its saved-tensor records and module calls a plan
    # could not run at autograd's hooks (every GPU plan ran interpreted until 2026-11-27)
    return replace(trace, storages=tuple(storages), ops=tuple(ops), meta=meta)
