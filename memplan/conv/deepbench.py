"""DeepBench's measured convolution times (Baidu Research; FP32 training results as CSV).

One row per layer and GPU: input W, H, C, batch N, K filters of S x R, padding, stride,
and the measured forward, backward-data and backward-filter milliseconds of the fastest
cuDNN algorithm (backward-data blank for input layers). These are the only GPU
measurements memplan has: they fit and test the `model` source (memplan.conv.fit).
"""

from __future__ import annotations

import csv
import os

from ..errors import MemplanError
from .kernels import Kernel

# DeepBench's GPU names and the memplan device profiles they correspond to.
GPU_PROFILES = {"NVIDIA V100": "v100", "NVIDIA Tesla P100": "p100", "NVIDIA GTX 1080 Ti": "gtx1080ti"}
_TIME_COLUMNS = {"fwd": "fwd_ms", "bwd_data": "bwd_data_ms", "bwd_filter": "bwd_filter_ms"}
_GEOMETRY = {"n": "N", "c": "C", "h": "H", "w": "W", "k": "K", "r": "R", "s": "S", "pad_h": "pad_h",
             "pad_w": "pad_w", "stride_h": "stride_h", "stride_w": "stride_w"}
_MS = 1e-3


def read_conv_csv(path: str | os.PathLike) -> dict[str, list[tuple[Kernel, float]]]:
    """Measured (kernel, seconds) per device profile name, in file order.

    Raises:
        MemplanError: the file cannot be read or is not DeepBench's conv CSV (one line).
    """
    out: dict[str, list[tuple[Kernel, float]]] = {}
    try:
        with open(path, newline="") as fh:
            for lineno, row in enumerate(csv.DictReader(fh), start=2):
                device = GPU_PROFILES.get(row.get("gpu", ""), row.get("gpu", ""))
                out.setdefault(device, []).extend(_measured(row, path, lineno))
    except OSError as exc:
        raise MemplanError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise MemplanError(f"{path}: not a text CSV ({exc.reason})") from None
    if not out:
        raise MemplanError(f"{path}: no convolution rows (expected DeepBench's conv_train_fp32.csv)")
    return out


def _measured(row: dict, path, lineno: int) -> list[tuple[Kernel, float]]:
    try:
        geometry = {name: int(row[column]) for name, column in _GEOMETRY.items()}
        return [(Kernel(kind=kind, **geometry), float(row[column]) * _MS)
                for kind, column in _TIME_COLUMNS.items() if row.get(column)]
    except (KeyError, TypeError, ValueError) as exc:
        raise MemplanError(f"{path}:{lineno}: not a DeepBench convolution row ({exc})") from None
