"""Ops as planners see them: their aten name, which are convolutions, when they start unconstrained."""

from __future__ import annotations

import numpy as np

from ...cost.model import Cost
from ...model import Op

ATEN = "aten."  # the namespace prefix of a traced op's name ("aten.relu_.default")
# aten names of 2-D convolutions, whatever backend ran them (a trace without geometry still names them).
CONV_OPS = frozenset({"convolution", "_convolution", "cudnn_convolution", "mkldnn_convolution", "conv2d"})


def aten_name(op: Op) -> str:
    """The op's name without namespace and overload ("relu_" for "aten.relu_.default")."""
    return op.name.split(".")[1] if op.name.startswith(ATEN) else op.name


def is_convolution(op: Op) -> bool:
    """True when `op` is a convolution: it has traced geometry (`Op.conv`) or a convolution's name."""
    return op.conv is not None or aten_name(op) in CONV_OPS


def op_starts(cost: Cost) -> np.ndarray:
    """Unconstrained start time of every op, plus the iteration's end as the last entry."""
    return np.concatenate([[0.0], np.cumsum(cost.durations)])
