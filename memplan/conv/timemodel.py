"""The `model` source's time: one formula for every algorithm family, fitted per GPU.

For family f on kernel k (memplan.conv.algos gives its flops F_f and traffic B_f):

    t = launch + a_f * a_kind * a_shape * F_f / (peak * u) + B_f / (bandwidth * e_mem)
    u = m*n / (m*n + sat) * m / (m + sat_rows)

where m x n is the implicit GEMM's output (fwd: N*P*Q x K, bwd_data: N*H*W x C,
bwd_filter: K*C/g*R*S x N*P*Q): small problems leave the GPU idle. a_f is the family's
cost per flop relative to the peak (1/efficiency), a_kind that of the backward kernels,
a_shape penalises strided data gradients and rewards 1x1 filters (a plain GEMM). The
coefficients come from DeepBench's measured cuDNN times (memplan.conv.fit); DeepBench
reports the fastest algorithm's time only, so the fit matches the fastest family's
prediction to it. A device without DeepBench data gets the fitted GPUs' geometric mean
coefficients with its own peak and bandwidth: an extrapolation, said so in its name.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from importlib import resources

import numpy as np

from ..cost.profiles import DeviceProfile
from ..errors import MemplanError
from ..fileio import atomic_write_text
from ..model import CONV_KERNELS
from .algos import FAMILIES, families_for, work
from .kernels import Kernel

COEFFICIENTS = "coefficients.json"  # package data written by `python benchmarks/ucudnn.py --only fit`
SCHEMA = "memplan.conv-time-model"
VERSION = 1


@dataclass(frozen=True, kw_only=True)
class FamilyTimeModel:
    """Coefficients of the family time model for one device."""

    profile: str  # the device profile's name (with "~" when extrapolated from other GPUs)
    peak_flops: float  # FP32 peak FLOP/s of the device
    bandwidth: float  # device memory bytes/s
    family: dict = field(default_factory=lambda: dict.fromkeys(FAMILIES, 1.0))  # a_f per family
    kind: dict = field(default_factory=lambda: dict.fromkeys(CONV_KERNELS, 1.0))  # a_kind (fwd is 1)
    strided_dgrad: float = 1.0  # a_shape of a bwd_data kernel with a stride above 1
    pointwise: float = 1.0  # a_shape of a 1x1 filter
    launch_s: float = 5e-6  # fixed seconds per call
    memory_efficiency: float = 0.8  # achieved share of the bandwidth
    saturation: float = 1e6  # sat: GEMM outputs at which half the GPU is busy
    saturation_rows: float = 1e3  # sat_rows: GEMM rows at which half the GPU is busy

    def time_s(self, family: str, kernel: Kernel) -> float:
        """Predicted seconds of `family` on `kernel` (the family must support it)."""
        w = work(family, kernel)
        m, n = gemm_shape(kernel)
        return float(_time(self.vector(), w.flops, w.bytes, FAMILIES.index(family),
                           CONV_KERNELS.index(kernel.kind), _shape_flags(kernel), m, n, self.peak_flops,
                           self.bandwidth))

    def fastest_s(self, kernel: Kernel) -> float:
        """Predicted seconds of the fastest family on `kernel` (what DeepBench measures)."""
        return min(self.time_s(f, kernel) for f in families_for(kernel))

    def times(self, kernels: list[Kernel]) -> np.ndarray:
        """Predicted seconds of every family on every kernel (kernels x FAMILIES; NaN where a
        family does not run the kernel), vectorised."""
        if not kernels:
            return np.empty((0, len(FAMILIES)))
        d = design(kernels)
        t = _time(self.vector(), d["flops"], d["bytes"], d["family"], d["kind"][:, None],
                  (d["strided"][:, None], d["pointwise"][:, None]), d["m"][:, None], d["n"][:, None],
                  self.peak_flops, self.bandwidth)
        return np.where(d["supported"], t, np.nan)

    # --- as a parameter vector (for the fit) -------------------------------------------------

    def vector(self) -> np.ndarray:
        """The coefficients as log-values, in the order `from_vector` reads."""
        values = [self.family[f] for f in FAMILIES] + [self.kind[k] for k in CONV_KERNELS[1:]] + [
            self.strided_dgrad, self.pointwise, self.launch_s, self.memory_efficiency, self.saturation,
            self.saturation_rows]
        return np.log(np.array(values, dtype=np.float64))

    def from_vector(self, x: np.ndarray) -> FamilyTimeModel:
        """A copy with the coefficients of a vector made like `vector()`."""
        v = np.exp(np.asarray(x, dtype=np.float64)).tolist()
        nf = len(FAMILIES)
        return replace(self, family=dict(zip(FAMILIES, v[:nf])), kind={"fwd": 1.0, **dict(zip(CONV_KERNELS[1:], v[nf:nf + 2]))},
                       strided_dgrad=v[nf + 2], pointwise=v[nf + 3], launch_s=v[nf + 4],
                       memory_efficiency=v[nf + 5], saturation=v[nf + 6], saturation_rows=v[nf + 7])

    def to_json(self) -> dict:
        """JSON-ready coefficients."""
        return asdict(self)


def gemm_shape(kernel: Kernel) -> tuple[float, float]:
    """The implicit GEMM's output matrix, rows x columns, of `kernel`."""
    if kernel.kind == "fwd":
        return float(kernel.n * kernel.out_h * kernel.out_w), float(kernel.k)
    if kernel.kind == "bwd_data":
        return float(kernel.n * kernel.h * kernel.w), float(kernel.c)
    return float(kernel.k * (kernel.c // kernel.groups) * kernel.r * kernel.s), float(kernel.n * kernel.out_h * kernel.out_w)


def _shape_flags(kernel: Kernel) -> tuple[bool, bool]:
    strided = kernel.kind == "bwd_data" and kernel.stride_h * kernel.stride_w > 1
    return strided, kernel.r == kernel.s == 1


def _time(x, flops, nbytes, family, kind, flags, m, n, peak, bandwidth):
    """The model's formula on log-coefficients `x` (scalars or equally shaped arrays)."""
    c = np.exp(x)
    nf = len(FAMILIES)
    a_kind = np.where(kind == 0, 1.0, c[nf + np.maximum(kind, 1) - 1])
    strided, pointwise = flags
    a_shape = np.where(strided, c[nf + 2], 1.0) * np.where(pointwise, c[nf + 3], 1.0)
    busy = m * n / (m * n + c[nf + 6]) * m / (m + c[nf + 7])
    return c[nf + 4] + c[family] * a_kind * a_shape * flops / (peak * busy) + nbytes / (bandwidth * c[nf + 5])


def predict_fastest(x: np.ndarray, design: dict, peak: float, bandwidth: float, softness: float = 0.0) -> np.ndarray:
    """The fastest family's predicted time per kernel of a `design` (see `design`), vectorised.

    With `softness` > 0 the minimum is a smooth one (a log-sum-exp at that temperature, in
    log-time), so that a fit can move between families.
    """
    t = _time(x, design["flops"], design["bytes"], design["family"], design["kind"][:, None],
              (design["strided"][:, None], design["pointwise"][:, None]), design["m"][:, None],
              design["n"][:, None], peak, bandwidth)
    logt = np.where(design["supported"], np.log(np.where(design["supported"], t, 1.0)), np.inf)
    low = logt.min(axis=1)
    if softness <= 0:
        return np.exp(low)
    return np.exp(low - softness * np.log(np.exp(-(logt - low[:, None]) / softness).sum(axis=1)))


def design(kernels: list[Kernel]) -> dict:
    """Per kernel and family, the quantities the formula needs, as arrays (kernels x families)."""
    shape = (len(kernels), len(FAMILIES))
    out = {"flops": np.ones(shape), "bytes": np.ones(shape), "supported": np.zeros(shape, dtype=bool),
           "family": np.broadcast_to(np.arange(len(FAMILIES)), shape)}
    for i, kernel in enumerate(kernels):
        for f in families_for(kernel):
            j = FAMILIES.index(f)
            w = work(f, kernel)
            out["flops"][i, j], out["bytes"][i, j], out["supported"][i, j] = w.flops, w.bytes, True
    out["kind"] = np.array([CONV_KERNELS.index(k.kind) for k in kernels])
    flags = np.array([_shape_flags(k) for k in kernels], dtype=bool).reshape(-1, 2)
    out["strided"], out["pointwise"] = flags[:, 0], flags[:, 1]
    gemm = np.array([gemm_shape(k) for k in kernels]).reshape(-1, 2)
    out["m"], out["n"] = gemm[:, 0], gemm[:, 1]
    return out


def fitted_models() -> dict[str, FamilyTimeModel]:
    """The committed fit, per DeepBench GPU (profile name)."""
    try:
        data = json.loads(resources.files("memplan.conv").joinpath(COEFFICIENTS).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise MemplanError(f"memplan.conv's fitted coefficients cannot be read: {exc}") from None
    if data.get("schema") != SCHEMA or data.get("version") != VERSION:
        raise MemplanError(f"memplan.conv's {COEFFICIENTS} is not a version {VERSION} time model")
    return {name: FamilyTimeModel(**coeffs) for name, coeffs in data["gpus"].items()}


def model_for(profile: DeviceProfile) -> FamilyTimeModel:
    """The time model of a device: its own fit, else the fitted GPUs' geometric mean coefficients
    with this device's peak FP32 rate and bandwidth."""
    fitted = fitted_models()
    if profile.name in fitted:
        return fitted[profile.name]
    mean = np.mean([m.vector() for m in fitted.values()], axis=0)
    base = FamilyTimeModel(profile=f"~{profile.name}", peak_flops=profile.fp32_flops, bandwidth=profile.hbm_bytes_per_s)
    return base.from_vector(mean)


def write_coefficients(models: dict[str, FamilyTimeModel], note: str, path) -> None:
    """Write fitted models as the package's coefficient file (atomically)."""
    data = {"schema": SCHEMA, "version": VERSION, "note": note,
            "gpus": {name: m.to_json() for name, m in sorted(models.items())}}
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")
