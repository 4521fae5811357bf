"""Fit the family time model (memplan.conv.timemodel) to measured times, and score it.

The fit minimises the squared log-error between the fastest family's predicted time and
the measured one (DeepBench reports only the fastest algorithm), with the minimum made
smooth so that the fit can move between families, plus a weak pull of every log-coefficient
towards a prior (families that never win keep their prior cost). Errors are reported as
ratios: a row's error is exp(|log(predicted / measured)|) - 1, so over- and under-estimates
by the same factor count alike; the geometric mean error is exp(mean |log ratio|) - 1.
Rows are split by layer shape (all batch sizes of one layer on the same side), so held-out
rows are layers the fit has never seen.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares

from ..cost.model import roofline_s
from ..cost.profiles import DeviceProfile
from .kernels import Kernel
from .timemodel import FamilyTimeModel, design, predict_fastest

SOFTNESS = 0.03  # temperature of the smooth minimum over families, in log-time
PRIOR_WEIGHT = 0.1  # pull of each log-coefficient towards the prior, against one row's log-error
PRIOR_FAMILY_COST = {"implicit_gemm": 1.2, "implicit_precomp_gemm": 1.2, "gemm": 2.0, "fft": 1.5,
                     "fft_tiling": 1.5, "winograd": 1.5, "winograd_nonfused": 1.5}
PRIOR_SATURATION = 1e7  # GEMM outputs for half occupancy
PRIOR_SATURATION_ROWS = 1e3  # GEMM rows for half occupancy

Samples = list[tuple[Kernel, float]]


def prior_model(profile: DeviceProfile) -> FamilyTimeModel:
    """The starting point and prior of a fit on `profile`'s device."""
    return FamilyTimeModel(profile=profile.name, peak_flops=profile.fp32_flops, bandwidth=profile.hbm_bytes_per_s,
                           family=dict(PRIOR_FAMILY_COST), saturation=PRIOR_SATURATION,
                           saturation_rows=PRIOR_SATURATION_ROWS)


def fit(samples: Samples, profile: DeviceProfile) -> FamilyTimeModel:
    """The family time model of `profile`'s device fitted to measured (kernel, seconds) samples."""
    prior = prior_model(profile)
    d = design([k for k, _ in samples])
    y = np.log([t for _, t in samples])
    x0 = prior.vector()

    def residuals(x):
        predicted = predict_fastest(x, d, prior.peak_flops, prior.bandwidth, softness=SOFTNESS)
        return np.concatenate([np.log(predicted) - y, PRIOR_WEIGHT * (x - x0)])

    return prior.from_vector(least_squares(residuals, x0).x)


def predict(model: FamilyTimeModel, kernels: list[Kernel]) -> np.ndarray:
    """The fastest family's predicted seconds per kernel."""
    return predict_fastest(model.vector(), design(kernels), model.peak_flops, model.bandwidth)


def roofline(kernels: list[Kernel], profile: DeviceProfile) -> np.ndarray:
    """Today's cost model on the same kernels: one roofline kernel of the direct convolution's
    flops and its tensors' bytes (memplan.cost.model.roofline_s)."""
    return np.array([roofline_s(k.flops, k.tensor_bytes, k.dtype, profile) for k in kernels])


def errors(predicted: np.ndarray, measured: np.ndarray) -> dict:
    """Median, 90th-percentile and geometric-mean ratio errors (see the module docstring)."""
    log_err = np.abs(np.log(np.asarray(predicted) / np.asarray(measured)))
    return {"rows": int(log_err.size), "median": float(np.expm1(np.median(log_err))),
            "p90": float(np.expm1(np.percentile(log_err, 90))), "geomean": float(np.expm1(log_err.mean()))}


def split_by_shape(samples: Samples, test_share: float, seed: int,
                   shapes: list | None = None) -> tuple[Samples, Samples]:
    """(train, test): each layer shape (every kind and batch of it) on one side, about
    `test_share` of the shapes held out, drawn with `seed` (from `shapes` when given, so that
    several GPUs hold out the same layers)."""
    shapes = sorted({_layer(k) for k, _ in samples}) if shapes is None else shapes
    rng = np.random.default_rng(seed)
    held = {s for s in shapes if rng.random() < test_share}
    train = [(k, t) for k, t in samples if _layer(k) not in held]
    test = [(k, t) for k, t in samples if _layer(k) in held]
    return train, test


def layer_shapes(*sample_lists: Samples) -> list:
    """The distinct layer shapes of all the samples, sorted."""
    return sorted({_layer(k) for samples in sample_lists for k, _ in samples})


def _layer(kernel: Kernel) -> tuple:
    """A layer's shape: the kernel's without its kind and batch."""
    return kernel.shape[1:]
