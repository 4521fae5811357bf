"""Measure the real GPU into a `DeviceProfile` (`memplan calibrate`).

What is measured, each as the median of several timed repeats after a warm-up (CUDA
events on the current stream):
- host<->device bandwidth each way, with large copies from/to pinned host memory;
- the fixed cost of one small pinned copy (copy latency);
- kernel launch latency, from a burst of tiny kernels;
- achieved FP32, TF32, BF16 and FP16 FLOP/s, with large square matmuls (the roofline prices
  each op at the one its dtype and the trace's TF32 settings say: `memplan.cost.model`);
- device memory bandwidth, with a large device-to-device copy (bytes read + written);
- the host's work per op and per executor step (memplan.cost.calibrate_host).

The profile stores the measured *achieved* rates as its peaks and sets the efficiency
factors to 1.0, so the roofline uses what this machine really reaches with large
kernels and copies; small layers reach less, and traces with measured op times
(`memplan trace --real`) are more precise still.
"""

from __future__ import annotations

import logging
import re
import statistics
from dataclasses import asdict, dataclass

import torch

from ..errors import MemplanError
from .calibrate_host import HostCosts, measure_host
from .profiles import DeviceProfile

log = logging.getLogger(__name__)

LINK_BYTES = 512 * 2**20  # one big pinned copy: long enough that the fixed latency is noise
HBM_BYTES = 1 * 2**30  # one big device copy
SMALL_COPY_BYTES = 4  # a copy that costs only its fixed latency
MATMUL_N = 8192  # square matmul size: large enough to saturate the tensor cores
TINY_KERNELS = 1000  # kernels in one launch-latency burst
REPEATS = 7  # timed repeats per measurement (median taken)
WARMUP = 2  # untimed runs first (lazy init, clocks ramping up)
MS = 1e-3  # CUDA events report milliseconds


@dataclass(frozen=True, kw_only=True)
class Measurements:
    """What `calibrate` measured, in plain units."""

    h2d_bytes_per_s: float  # pinned host -> device
    d2h_bytes_per_s: float  # device -> pinned host
    copy_latency_s: float  # one tiny pinned copy
    launch_s: float  # one tiny kernel
    fp32_flops: float  # achieved FP32 matmul FLOP/s (TF32 off)
    tf32_flops: float  # achieved FP32 matmul FLOP/s with TF32 allowed
    bf16_flops: float  # achieved BF16 matmul FLOP/s
    hbm_bytes_per_s: float  # device copy: (read + written bytes) / s
    fp16_flops: float | None = None  # achieved FP16 matmul FLOP/s (None: not measured, the BF16 rate stands in)
    host: HostCosts | None = None  # the host's work per op and per executor step (None: not measured)


def calibrate(gpu: int = 0, *, name: str | None = None, repeats: int = REPEATS) -> DeviceProfile:
    """Measure CUDA device `gpu` and return its profile (calibrated=True).

    Args:
        gpu: CUDA device index.
        name: profile name; default from the GPU's name (e.g. "nvidia-h100-80gb-hbm3").
        repeats: timed repeats per measurement.
    Returns:
        The profile; `profile_to_json` writes it in the form `--device FILE` reads.
    Raises:
        MemplanError: no CUDA GPU (or no such index).
    """
    if not torch.cuda.is_available():
        raise MemplanError("calibrate needs a CUDA GPU")
    if not 0 <= gpu < torch.cuda.device_count():
        raise MemplanError(f"no CUDA device {gpu}; this machine has {torch.cuda.device_count()}")
    with torch.cuda.device(gpu):
        measured = measure(repeats)
        props = torch.cuda.get_device_properties(gpu)
    log.info("calibrated %s: %s", props.name, measured)
    return profile_from(measured, name=name or slug(props.name), description=props.name,
                        memory_bytes=int(props.total_memory))


def profile_from(m: Measurements, *, name: str, description: str, memory_bytes: int,
                 kind: str = "gpu") -> DeviceProfile:
    """The profile for measured numbers: achieved rates as peaks, efficiencies 1.0.

    Args:
        m: the measurements.
        name: profile name.
        description: the device's marketing name.
        memory_bytes: device memory size.
        kind: "gpu" or "cpu".
    """
    return DeviceProfile(name=name, description=description, fp32_flops=m.fp32_flops, tf32_flops=m.tf32_flops,
                         bf16_flops=m.bf16_flops, memory_bytes=memory_bytes, hbm_bytes_per_s=m.hbm_bytes_per_s,
                         h2d_bytes_per_s=m.h2d_bytes_per_s, d2h_bytes_per_s=m.d2h_bytes_per_s, launch_s=m.launch_s,
                         copy_latency_s=m.copy_latency_s, compute_efficiency=1.0, memory_efficiency=1.0,
                         link_efficiency=1.0, calibrated=True, kind=kind, fp16_flops=m.fp16_flops,
                         **(asdict(m.host) if m.host is not None else {}))


def slug(text: str) -> str:
    """A lower-case, dash-separated name: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def measure(repeats: int = REPEATS) -> Measurements:
    """Run every measurement on the current CUDA device."""
    h2d, d2h = link_bandwidth(LINK_BYTES, repeats)
    return Measurements(h2d_bytes_per_s=h2d, d2h_bytes_per_s=d2h, copy_latency_s=copy_latency(repeats),
                        launch_s=launch_latency(repeats), host=measure_host("cuda"),
                        fp32_flops=matmul_flops("float32", False, repeats),
                        tf32_flops=matmul_flops("float32", True, repeats),
                        bf16_flops=matmul_flops("bfloat16", False, repeats),
                        fp16_flops=matmul_flops("float16", False, repeats),
                        hbm_bytes_per_s=memory_bandwidth(HBM_BYTES, repeats))


def time_cuda(fn, repeats: int = REPEATS) -> float:
    """Median seconds of `fn()` on the current stream, timed with CUDA events after a warm-up."""
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * MS)
    return statistics.median(times)


def link_bandwidth(nbytes: int, repeats: int = REPEATS) -> tuple[float, float]:
    """(host->device, device->host) bytes/s with one `nbytes` copy from/to pinned memory."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    h2d = time_cuda(lambda: dev.copy_(host, non_blocking=True), repeats)
    d2h = time_cuda(lambda: host.copy_(dev, non_blocking=True), repeats)
    return nbytes / h2d, nbytes / d2h


def copy_latency(repeats: int = REPEATS) -> float:
    """Seconds of one tiny pinned host-to-device copy: the fixed cost per copy."""
    host = torch.empty(SMALL_COPY_BYTES, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(SMALL_COPY_BYTES, dtype=torch.uint8, device="cuda")
    return time_cuda(lambda: dev.copy_(host, non_blocking=True), repeats)


def launch_latency(repeats: int = REPEATS) -> float:
    """Seconds per kernel in a burst of tiny in-place adds (launch-bound, not work-bound)."""
    x = torch.zeros(1, device="cuda")

    def burst():
        for _ in range(TINY_KERNELS):
            x.add_(1.0)

    return time_cuda(burst, repeats) / TINY_KERNELS


def matmul_flops(dtype: str, allow_tf32: bool, repeats: int = REPEATS, n: int = MATMUL_N) -> float:
    """Achieved FLOP/s of an n x n x n matmul in `dtype` (TF32 allowed or not for float32)."""
    torch_dtype = getattr(torch, dtype)
    a = torch.randn(n, n, device="cuda", dtype=torch_dtype)
    b = torch.randn(n, n, device="cuda", dtype=torch_dtype)
    out = torch.empty(n, n, device="cuda", dtype=torch_dtype)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32  # restored below: no global state leaks out
    try:
        seconds = time_cuda(lambda: torch.matmul(a, b, out=out), repeats)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return 2.0 * n**3 / seconds


def memory_bandwidth(nbytes: int, repeats: int = REPEATS) -> float:
    """Device memory bytes/s of one `nbytes` device-to-device copy (it reads and writes nbytes)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * nbytes / time_cuda(lambda: dst.copy_(src), repeats)
