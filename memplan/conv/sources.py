"""Where benchmark rows come from, and the options a planner reads (from the database, filling gaps).

Three sources, each naming its rows (`Row.source`):

- `model` (`model:<device>`): every algorithm family that runs the kernel, its workspace
  by formula (memplan.conv.algos) and its time by the fitted family model
  (memplan.conv.timemodel). Predicted, never measured; needs nothing but a device profile.
- `cpu` (`cpu:<processor> (<threads> threads)`): PyTorch's own CPU convolution (oneDNN
  picks the algorithm; recorded as `pytorch`), timed here with the best of a few runs
  after a warm-up. Its workspace is unknown and stored as such (NULL), never as 0.
- `cudnn` (`cudnn:<GPU name>`): cuDNN's engines through nvidia-cudnn-frontend, their
  workspace as cuDNN reports it and their time measured with CUDA events
  (memplan.conv.cudnn). Needs a CUDA GPU.

Planning reads options per micro-batch size from the database and has the source fill
the sizes it lacks. An unknown workspace is planned as 0 bytes: a limit cannot bound
what nobody knows, and the plan's `source` says the numbers are a CPU's. The `cpu` and `cudnn`
sources import torch when they are made: planning from the `model` source needs none.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import time

from ..cost.profiles import DeviceProfile
from ..errors import MemplanError, unknown_name
from .algos import FAMILIES, workspace_bytes
from .db import ConvDB, Row
from .kernels import Kernel
from .options import Option
from .timemodel import model_for

log = logging.getLogger(__name__)

SOURCES = ("model", "cpu", "cudnn")
CPU_ALGO = "pytorch"
CPU_REPEATS = 3  # timed runs per kernel after one warm-up; the fastest counts (others share this host)


class ModelSource:
    """Rows predicted by the family time model for one device."""

    workspace_known = True

    def __init__(self, profile: DeviceProfile):
        self.model = model_for(profile)
        self.name = f"model:{self.model.profile}"

    def measure(self, kernels: list[Kernel]) -> list[Row]:
        """Every supported family on every kernel."""
        times = self.model.times(kernels)
        return [Row(kernel=k, algo=f, source=self.name, time_s=float(times[i, j]),
                    workspace_bytes=workspace_bytes(f, k))
                for i, k in enumerate(kernels) for j, f in enumerate(FAMILIES) if not math.isnan(times[i, j])]


class CpuSource:
    """Rows measured with PyTorch's CPU convolution on this machine."""

    workspace_known = False

    def __init__(self, repeats: int = CPU_REPEATS):
        import torch

        self.repeats = repeats
        self.name = f"cpu:{cpu_name()} ({torch.get_num_threads()} threads)"

    def measure(self, kernels: list[Kernel]) -> list[Row]:
        """One row per kernel: the best of `repeats` timed runs."""
        return [Row(kernel=k, algo=CPU_ALGO, source=self.name, time_s=time_kernel(k, self.repeats),
                    workspace_bytes=None) for k in kernels]


def time_kernel(kernel: Kernel, repeats: int = CPU_REPEATS) -> float:
    """Seconds of one run of `kernel` with PyTorch on the CPU (best of `repeats`, after a warm-up)."""
    run = kernel_call(kernel)
    run()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def kernel_call(kernel: Kernel, device: str = "cpu"):
    """A no-argument function that runs `kernel` once through aten (random data, made once)."""
    import torch

    dtype = getattr(torch, kernel.dtype)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(kernel.n, kernel.c, kernel.h, kernel.w, generator=gen).to(device, dtype)
    weight = torch.randn(kernel.k, kernel.c // kernel.groups, kernel.r, kernel.s, generator=gen).to(device, dtype)
    geometry = ([kernel.stride_h, kernel.stride_w], [kernel.pad_h, kernel.pad_w], [kernel.dil_h, kernel.dil_w],
                False, [0, 0], kernel.groups)
    if kernel.kind == "fwd":
        return lambda: torch.ops.aten.convolution.default(x, weight, None, *geometry)
    dy = torch.randn(kernel.n, kernel.k, kernel.out_h, kernel.out_w, generator=gen).to(device, dtype)
    mask = [kernel.kind == "bwd_data", kernel.kind == "bwd_filter", False]
    return lambda: torch.ops.aten.convolution_backward.default(dy, x, weight, None, *geometry, mask)


def cpu_name() -> str:
    """This machine's processor model, as /proc/cpuinfo names it (else the platform's word)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def get_source(name: str, profile: DeviceProfile | None = None):
    """A source by name: `model` (for `profile`'s device), `cpu` or `cudnn`.

    Raises:
        UnknownNameError: another name.
        MemplanError: `cudnn` without a CUDA GPU or without nvidia-cudnn-frontend.
    """
    if name == "model":
        if profile is None:
            raise MemplanError("the model source needs a device profile")
        return ModelSource(profile)
    if name == "cpu":
        return CpuSource()
    if name == "cudnn":
        from .cudnn import CudnnSource

        return CudnnSource()
    raise unknown_name("benchmark source", name, SOURCES)


def options_for(kernel: Kernel, sizes: list[int], source, db: ConvDB) -> dict[int, list[Option]]:
    """Per micro-batch size, the options of `kernel` from `db`, having `source` fill the sizes it lacks."""
    rows = {b: db.get(kernel.with_batch(b), source.name) for b in sizes}
    missing = [kernel.with_batch(b) for b, found in rows.items() if not found]
    if missing:
        started = time.perf_counter()
        fresh = source.measure(missing)
        db.put(fresh)
        for r in fresh:
            rows[r.kernel.n].append(r)
        log.info("%s: %d rows for %s in %.2f s", source.name, len(fresh), kernel.describe(),
                 time.perf_counter() - started)
    return {b: [Option(time_s=r.time_s, workspace_bytes=r.workspace_bytes or 0, algo=r.algo) for r in found]
            for b, found in rows.items()}


def database(path: str | os.PathLike | None) -> ConvDB:
    """The database at `path` (created when missing), or an in-memory one for None or ""."""
    return ConvDB(path or None)
