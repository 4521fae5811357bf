"""The math settings in force while a step is traced, which decide the precision its ops run in.

FP32 matmuls and convolutions run on TF32 tensor cores when PyTorch allows it: convolutions by
default (`torch.backends.cudnn.allow_tf32`), matmuls when `torch.backends.cuda.matmul.allow_tf32`
is set or `torch.set_float32_matmul_precision` is "high" or "medium" (which set that flag). The
trace records them in `meta["math"]` so the cost model prices each op at the right peak.

Autocast is recorded as it is when tracing starts. A step that enters autocast itself needs no
record: its ops reach the tracer already cast, and their dtypes say what they run in.
"""

from __future__ import annotations

import torch


def math_settings(device_type: str) -> dict:
    """The settings in force now, JSON-ready.

    Args:
        device_type: "cuda" or "cpu": whose autocast state is recorded.
    Returns:
        {"matmul_tf32", "cudnn_tf32", "float32_matmul_precision", "autocast_dtype"}; the last is
        None when autocast is off for `device_type`.
    """
    try:
        autocast = torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type autocast does not know
        autocast = False
    return {"matmul_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "autocast_dtype": _dtype_name(torch.get_autocast_dtype(device_type)) if autocast else None}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
