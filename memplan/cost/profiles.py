"""Device profiles: the numbers the roofline cost model and the simulator need.

Peak numbers come from the vendors' spec sheets (cited per profile). Real kernels and
copies reach only part of a peak; the `*_efficiency` factors say how much, and
`memplan calibrate` measures them on a real GPU (or, with `--device cpu`, this machine's
CPU) and writes a profile file that `--device` accepts alongside the built-in names.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path

from ..errors import MemplanError, UnknownNameError

TFLOPS = 1e12
GBPS = 1e9
GIB = 2**30

# Typical shares of a peak that real work reaches (used unless a profile is calibrated):
# cuDNN/cuBLAS reach ~60-70% of peak FLOP/s on large layers, elementwise kernels ~80% of
# HBM bandwidth, and pinned copies ~80% of the PCIe link's theoretical rate.
DEFAULT_COMPUTE_EFFICIENCY = 0.6
DEFAULT_MEMORY_EFFICIENCY = 0.8
DEFAULT_LINK_EFFICIENCY = 0.8


@dataclass(frozen=True, kw_only=True)
class DeviceProfile:
    """What the cost model knows about one device (a GPU, or the CPU) and its host link."""

    name: str  # short name used on the command line
    description: str  # marketing name
    fp32_flops: float  # peak FP32 FLOP/s (non-tensor-core)
    tf32_flops: float  # peak TF32 tensor-core FLOP/s, dense (fp32_flops where there is none)
    bf16_flops: float  # peak BF16 FLOP/s, dense (tensor cores where the device has them for BF16)
    memory_bytes: int  # device memory size
    hbm_bytes_per_s: float  # device memory bandwidth
    h2d_bytes_per_s: float  # host-to-device link bandwidth (one direction)
    d2h_bytes_per_s: float  # device-to-host link bandwidth (one direction)
    launch_s: float  # kernel launch latency added to every op
    copy_latency_s: float = 10e-6  # fixed cost of one host<->device copy
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY  # achieved / peak FLOP/s
    memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY  # achieved / peak HBM bandwidth
    link_efficiency: float = DEFAULT_LINK_EFFICIENCY  # achieved / peak link bandwidth
    calibrated: bool = False  # True when the numbers were measured by `memplan calibrate`
    intra_link: str = "pcie4"  # GPU-to-GPU link inside a node (a memplan.cost.network.LINKS name)
    inter_link: str = "ib-hdr"  # network between nodes, one NIC per GPU (a LINKS name)
    gpus_per_node: int = 8  # GPUs sharing the intra-node link
    kind: str = "gpu"  # "cpu": the host itself is the device, its "link" a copy into the host slab
    fp16_flops: float | None = None  # peak FP16 FLOP/s, dense; None: as bf16_flops (files before it was kept)
    # The host's work, which the device waits for when it is faster (memplan.sim.simulate, "host"):
    host_op_s: float = 0.0  # per op of plain eager training: Python, autograd, dispatch, launch
    hook_s: float = 0.0  # per saved-tensor pack or unpack under the interpreted executor's identity hooks
    # per Python call of a hook the hooked executor installs (a module's, a saved-tensor window's pack or
    # unpack, an optimizer step's), beside the actions it takes there; None: as hook_s (files before it
    # was kept), resolved when the profile is made
    hook_call_s: float | None = None
    mode_op_s: float = 0.0  # per op through the interpreted executor's dispatch mode, beyond host_op_s
    # per op the interpreted executor runs while a storage is away, beyond mode_op_s: its arguments checked
    # against the storages away, measured with the executor itself (0.0: not measured, files before it was kept)
    guard_op_s: float = 0.0
    replay_op_s: float = 0.0  # per op the interpreted executor replays, beyond host_op_s
    # per op whose call the interpreted executor records in a step to replay it later (its arguments as
    # storages and views), measured with the executor itself (0.0: not measured, files before it was kept)
    record_op_s: float = 0.0
    action_s: float = 0.0  # per executor action (swap-out, release, prefetch, wait, drop, recomputation)
    region_s: float = 0.0  # per module call the hooked executor runs again, beside its ops (arguments, RNG, hooks)
    # per stretch of an optimizer's step the hooked executor splits off (memplan.tracing.stepwise): one more
    # call of the step's Python (32 us a split measured on the 2-core CPU host, hf:gpt2-tiny's AdamW)
    stretch_s: float = 30e-6

    def __post_init__(self):
        if self.hook_call_s is None:
            object.__setattr__(self, "hook_call_s", self.hook_s)

    def peak_flops(self, dtype: str | None, allow_tf32: bool = False) -> float:
        """Peak FLOP/s for ops of `dtype`: BF16 or FP16 rate for 16-bit types; for the rest the
        TF32 tensor-core rate when TF32 is allowed for the op, else the FP32 one."""
        if dtype == "bfloat16":
            return self.bf16_flops
        if dtype == "float16":
            return self.fp16_flops if self.fp16_flops is not None else self.bf16_flops
        return self.tf32_flops if allow_tf32 else self.fp32_flops


# PCIe theoretical per-direction rates: Gen3 x16 15.75 GB/s, Gen4 x16 31.5 GB/s, Gen5 x16 63 GB/s.
_PCIE3, _PCIE4, _PCIE5 = 15.75 * GBPS, 31.5 * GBPS, 63.0 * GBPS

# The host of a GPU server (measured on the H100/H200 hosts of benchmarks/results, torch 2.11):
# plain eager gpt2@8 ran 2,195 ops in 0.0327 s and transformer-encoder@32 719 in 0.0095 s,
# host-bound, 13-15 us an op; a dispatch mode that only calls each op added 12.8 us an op
# (gpu_unseen_h100). Hook, replay and action costs are the CPU's (exec_overhead, this project's
# host) scaled by that mode's GPU/CPU ratio (12.8 / 5.2); `memplan calibrate` measures them.
GPU_HOST = {"host_op_s": 12e-6, "hook_s": 6e-6, "hook_call_s": 6e-6, "mode_op_s": 12.8e-6, "replay_op_s": 130e-6,
            "action_s": 30e-6, "region_s": 150e-6}

BUILTIN = {
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): FP32 67 TF, TF32 494.7 TF dense
    # (989 with sparsity), BF16 and FP16 989.4 TF dense, 80 GB HBM3 at 3.35 TB/s, PCIe Gen5.
    "h100": DeviceProfile(name="h100", description="NVIDIA H100 SXM 80GB", fp32_flops=67 * TFLOPS,
                          tf32_flops=494.7 * TFLOPS, bf16_flops=989.4 * TFLOPS, memory_bytes=80 * 10**9,
                          hbm_bytes_per_s=3350 * GBPS, h2d_bytes_per_s=_PCIE5, d2h_bytes_per_s=_PCIE5,
                          launch_s=4e-6),
    # NVIDIA H200 datasheet (SXM): same compute as H100 SXM, 141 GB HBM3e at 4.8 TB/s, PCIe Gen5.
    "h200": DeviceProfile(name="h200", description="NVIDIA H200 SXM 141GB", fp32_flops=67 * TFLOPS,
                          tf32_flops=494.7 * TFLOPS, bf16_flops=989.4 * TFLOPS, memory_bytes=141 * 10**9,
                          hbm_bytes_per_s=4800 * GBPS, h2d_bytes_per_s=_PCIE5, d2h_bytes_per_s=_PCIE5,
                          launch_s=4e-6),
    # NVIDIA A100 datasheet (40GB SXM): FP32 19.5 TF, TF32 156 TF, BF16 and FP16 312 TF dense,
    # HBM2 1,555 GB/s, PCIe Gen4.
    "a100": DeviceProfile(name="a100", description="NVIDIA A100 40GB", fp32_flops=19.5 * TFLOPS,
                          tf32_flops=156 * TFLOPS, bf16_flops=312 * TFLOPS, memory_bytes=40 * 10**9,
                          hbm_bytes_per_s=1555 * GBPS, h2d_bytes_per_s=_PCIE4, d2h_bytes_per_s=_PCIE4,
                          launch_s=5e-6),
    # NVIDIA Tesla V100 datasheet (SXM2 16GB): FP32 15.7 TF, tensor (FP16) 125 TF, no TF32 and
    # no BF16 tensor cores (BF16 runs at most at the FP32 rate), HBM2 900 GB/s, PCIe Gen3.
    "v100": DeviceProfile(name="v100", description="NVIDIA V100 16GB", fp32_flops=15.7 * TFLOPS,
                          tf32_flops=15.7 * TFLOPS, bf16_flops=15.7 * TFLOPS, fp16_flops=125 * TFLOPS,
                          memory_bytes=16 * 10**9,
                          hbm_bytes_per_s=900 * GBPS, h2d_bytes_per_s=_PCIE3, d2h_bytes_per_s=_PCIE3,
                          launch_s=5e-6),
    # NVIDIA Tesla P100 datasheet (PCIe 16GB): FP32 9.3 TF, FP16 18.7 TF, no tensor cores, no BF16,
    # HBM2 732 GB/s, PCIe Gen3. (DeepBench's P100 results, paper 003's P100-SXM2 runs 10.6 TF.)
    "p100": DeviceProfile(name="p100", description="NVIDIA Tesla P100 16GB", fp32_flops=9.3 * TFLOPS,
                          tf32_flops=9.3 * TFLOPS, bf16_flops=9.3 * TFLOPS, fp16_flops=18.7 * TFLOPS,
                          memory_bytes=16 * 10**9,
                          hbm_bytes_per_s=732 * GBPS, h2d_bytes_per_s=_PCIE3, d2h_bytes_per_s=_PCIE3,
                          launch_s=5e-6),
    # NVIDIA Turing architecture whitepaper, GeForce RTX 2080 Ti (reference): FP32 13.4 TF,
    # FP16 tensor with FP32 accumulate 53.8 TF, no BF16, 11 GB GDDR6 at 616 GB/s, PCIe Gen3.
    "rtx2080ti": DeviceProfile(name="rtx2080ti", description="NVIDIA GeForce RTX 2080 Ti",
                               fp32_flops=13.4 * TFLOPS, tf32_flops=13.4 * TFLOPS, bf16_flops=13.4 * TFLOPS,
                               fp16_flops=53.8 * TFLOPS,
                               memory_bytes=11 * GIB, hbm_bytes_per_s=616 * GBPS, h2d_bytes_per_s=_PCIE3,
                               d2h_bytes_per_s=_PCIE3, launch_s=5e-6),
    # NVIDIA GeForce GTX 1080 Ti spec page: FP32 11.3 TF (boost), no tensor cores, FP16 at 1/64
    # of the FP32 rate (GP102), 11 GB GDDR5X at 484 GB/s, PCIe Gen3.
    "gtx1080ti": DeviceProfile(name="gtx1080ti", description="NVIDIA GeForce GTX 1080 Ti",
                               fp32_flops=11.3 * TFLOPS, tf32_flops=11.3 * TFLOPS, bf16_flops=11.3 * TFLOPS,
                               fp16_flops=11.3 / 64 * TFLOPS,
                               memory_bytes=11 * GIB, hbm_bytes_per_s=484 * GBPS, h2d_bytes_per_s=_PCIE3,
                               d2h_bytes_per_s=_PCIE3, launch_s=5e-6),
}


# Interconnects of the usual 8-GPU servers: DGX H100/H200 (NVLink 4, ConnectX-7 NDR), DGX A100
# (NVLink 3, ConnectX-6 HDR), DGX-1 V100 (NVLink 2); consumer and PCIe cards talk over PCIe.
_LINKS = {"h100": ("nvlink4", "ib-ndr"), "h200": ("nvlink4", "ib-ndr"), "a100": ("nvlink3", "ib-hdr"),
          "v100": ("nvlink2", "ib-hdr"), "p100": ("pcie3", "ib-hdr"), "rtx2080ti": ("pcie3", "ib-hdr"),
          "gtx1080ti": ("pcie3", "ib-hdr")}
BUILTIN = {name: replace(p, intra_link=_LINKS[name][0], inter_link=_LINKS[name][1], **GPU_HOST)
           for name, p in BUILTIN.items()}


def get_profile(name_or_path: str | DeviceProfile) -> DeviceProfile:
    """A built-in profile by name, or a profile JSON file written by `memplan calibrate`.

    Raises:
        UnknownNameError: neither a built-in name nor an existing file.
        MemplanError: the file is not a valid profile.
    """
    if isinstance(name_or_path, DeviceProfile):
        return name_or_path
    if name_or_path in BUILTIN:
        return BUILTIN[name_or_path]
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        return read_profile(path)
    raise UnknownNameError(f"unknown profile {name_or_path!r}; known: {', '.join(sorted(BUILTIN))}, or a profile "
                           f"file that `memplan calibrate` wrote")


def read_profile(path: str | os.PathLike) -> DeviceProfile:
    """Read a profile JSON file (all DeviceProfile fields)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MemplanError(f"{path}: not a device profile: {exc}") from None
    return profile_from_json(data, str(path))


def profile_from_json(data, source: str = "<profile>") -> DeviceProfile:
    """The DeviceProfile of `profile_to_json` output, every field checked.

    Raises:
        MemplanError: naming `source` and the first field that is missing, unknown or wrong.
    """
    if not isinstance(data, dict):
        raise MemplanError(f"{source}: not a device profile (expected an object)")
    known = {f.name: f for f in fields(DeviceProfile)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise MemplanError(f"{source}: unknown profile field {unknown[0]!r}")
    missing = sorted(name for name, f in known.items() if name not in data and f.default is MISSING)
    if missing:
        raise MemplanError(f"{source}: device profile field {missing[0]!r} is missing")
    for name, value in data.items():
        if not _fits(known[name].type, name, value):
            raise MemplanError(f"{source}: device profile field {name!r} cannot be {value!r}")
    return DeviceProfile(**data)


def _fits(kind: str, name: str, value) -> bool:
    """Whether `value` is a sound value of a field annotated `kind`: a number finite and positive
    (a latency, `*_s`, may be 0), a count positive, a flag a bool, a name a string."""
    if value is None:
        return kind.endswith("| None")  # an optional field (a peak older files do not have)
    kind = kind.removesuffix(" | None")
    if kind == "bool" or kind == "str":
        return type(value).__name__ == kind
    if isinstance(value, bool) or not isinstance(value, int if kind == "int" else (int, float)):
        return False
    return math.isfinite(value) and (value >= 0 if name.endswith("_s") else value > 0)


def profile_to_json(profile: DeviceProfile) -> dict:
    """The JSON form `read_profile` accepts."""
    return asdict(profile)


def with_overrides(profile: DeviceProfile, **changes) -> DeviceProfile:
    """A copy of `profile` with some numbers replaced (e.g. measured ones)."""
    return replace(profile, **changes)
