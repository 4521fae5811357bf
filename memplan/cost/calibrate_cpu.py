"""Measure this machine's CPU into a `DeviceProfile` (`memplan calibrate --device cpu`).

On the CPU the host is the device: the memory a plan keeps live is host memory, and a swap
is a copy into the executor's host slab, i.e. between two host buffers. So the profile's
"link" is that copy's bandwidth (the same each way), its copy latency that of a tiny copy,
and its launch latency the dispatch overhead of one tiny eager op; the host's work per op and
per executor step as memplan.cost.calibrate_host measures it. Each figure is the median
of several wall-clock repeats after a warm-up, with the thread count torch uses now (written
into the description: the figures hold for that count). Sizes are kept small so the whole
calibration takes a few seconds.
"""

from __future__ import annotations

import logging
import os
import platform
import statistics
import time

import torch

from .calibrate import Measurements, profile_from
from .calibrate_host import measure_host
from .profiles import DeviceProfile

log = logging.getLogger(__name__)

COPY_BYTES = 64 * 2**20  # one host copy: far beyond the caches, short enough to repeat
SMALL_COPY_BYTES = 4  # a copy that costs only its fixed overhead
MATMUL_N = 1024  # FP32 square matmul: large enough to reach the BLAS kernel's rate
BF16_MATMUL_N = 512  # BF16 is slow on CPUs without AMX: a smaller matmul keeps calibration short
FP16_MATMUL_N = 256  # FP16 slower still (2.5 GFLOP/s on this project's 2-core host)
TINY_OPS = 2000  # ops in one dispatch-overhead burst
SMALL_COPIES = 200  # copies in one copy-latency burst
REPEATS = 5
WARMUP = 2  # the first call of a kernel packs weights or spins threads up


def calibrate_cpu(*, name: str | None = None, repeats: int = REPEATS) -> DeviceProfile:
    """Measure this CPU and return its profile (kind "cpu", calibrated=True).

    Args:
        name: profile name (default "cpu").
        repeats: timed repeats per measurement.
    """
    measured = measure_cpu(repeats)
    threads = torch.get_num_threads()
    log.info("calibrated the CPU (%d threads): %s", threads, measured)
    return profile_from(measured, name=name or "cpu", description=f"{cpu_model()} ({threads} torch threads)",
                        memory_bytes=physical_memory_bytes(), kind="cpu")


def measure_cpu(repeats: int = REPEATS) -> Measurements:
    """Run every measurement on the CPU."""
    copy = host_copy_bandwidth(COPY_BYTES, repeats)
    fp32 = matmul_flops("float32", MATMUL_N, repeats)
    launch = dispatch_s(repeats)
    return Measurements(h2d_bytes_per_s=copy, d2h_bytes_per_s=copy, copy_latency_s=small_copy_s(repeats),
                        launch_s=launch, host=measure_host("cpu", launch), fp32_flops=fp32, tf32_flops=fp32,
                        bf16_flops=matmul_flops("bfloat16", BF16_MATMUL_N, repeats),
                        fp16_flops=matmul_flops("float16", FP16_MATMUL_N, repeats),
                        hbm_bytes_per_s=2 * copy)  # a copy reads and writes its bytes


def time_wall(fn, repeats: int = REPEATS) -> float:
    """Median wall-clock seconds of `fn()` after a warm-up (CPU ops are synchronous)."""
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def host_copy_bandwidth(nbytes: int, repeats: int = REPEATS) -> float:
    """Bytes/s of one `nbytes` copy between two host buffers (a swap into the host slab)."""
    src = torch.ones(nbytes, dtype=torch.uint8)  # written once, so its pages exist
    dst = torch.zeros_like(src)
    return nbytes / time_wall(lambda: dst.copy_(src), repeats)


def small_copy_s(repeats: int = REPEATS) -> float:
    """Seconds of one tiny host copy: the fixed cost per copy as the CPU executor pays it (its
    copies run inline, memplan.exec.engine)."""
    src, dst = torch.ones(SMALL_COPY_BYTES, dtype=torch.uint8), torch.zeros(SMALL_COPY_BYTES, dtype=torch.uint8)

    def burst():
        for _ in range(SMALL_COPIES):
            dst.copy_(src)

    return time_wall(burst, repeats) / SMALL_COPIES


def dispatch_s(repeats: int = REPEATS) -> float:
    """Seconds per op in a burst of tiny in-place adds: eager dispatch overhead, no work."""
    x = torch.zeros(1)

    def burst():
        for _ in range(TINY_OPS):
            x.add_(1.0)

    return time_wall(burst, repeats) / TINY_OPS


def matmul_flops(dtype: str, n: int, repeats: int = REPEATS) -> float:
    """Achieved FLOP/s of an n x n x n matmul in `dtype`."""
    torch_dtype = getattr(torch, dtype)
    a, b = torch.randn(n, n).to(torch_dtype), torch.randn(n, n).to(torch_dtype)
    out = torch.empty(n, n, dtype=torch_dtype)
    return 2.0 * n**3 / time_wall(lambda: torch.matmul(a, b, out=out), repeats)


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def physical_memory_bytes() -> int:
    """This machine's RAM (0 where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0
