"""A trace's convolution decisions: WR or WD over all its kernels, as the plan's MicroBatch entries.

Kernels of equal shape (and batch) are benchmarked and optimised once. Each op can also
be given a memory headroom (budget minus what the trace holds while it runs): a kernel's
configuration must fit it, so the decisions never push the plan over its budget.
"""

from __future__ import annotations

import os

import numpy as np

from ..cost.profiles import DeviceProfile
from ..errors import MemplanError
from ..model import MicroBatch, Trace
from ..units import format_bytes
from . import wd
from .kernels import TraceKernel, trace_kernels
from .options import Config, accumulator_bytes, policy_sizes
from .sources import database, get_source, options_for
from .wr import best_config

MODES = ("wr", "wd")


def decide(trace: Trace, profile: DeviceProfile, *, mode: str, workspace: int, policy: str, source: str = "model",
           db: str | os.PathLike | None = None, headroom: np.ndarray | None = None) -> tuple[MicroBatch, ...]:
    """Micro-batches and algorithms for every convolution kernel of `trace`.

    Args:
        trace: the traced iteration (its ops' ConvParams name the kernels).
        profile: the device (the `model` source prices kernels for it).
        mode: "wr" (`workspace` is each kernel's limit) or "wd" (`workspace` is the total).
        workspace: the workspace limit in bytes.
        policy: the batch-size policy ("all", "powerOfTwo", "undivided").
        source: "model", "cpu" or "cudnn" (memplan.conv.sources).
        db: benchmark database file to read and extend (None: in memory only).
        headroom: per op, the most temporary bytes it may hold (None: no such limit).
    Raises:
        MemplanError: an unknown mode, policy or source, or no configuration fits.
    """
    if mode not in MODES:
        raise MemplanError(f"unknown workspace policy {mode!r}; known: {', '.join(MODES)}")
    kernels = trace_kernels(trace)
    src = get_source(source, profile)
    with database(db) as cdb:
        options = {k: options_for(k, policy_sizes(policy, k.n), src, cdb) for k in {tk.kernel for tk in kernels}}
    room = [int(headroom[tk.op]) if headroom is not None else workspace for tk in kernels]
    if mode == "wr":
        configs = _wr(kernels, options, workspace, room)
    else:
        configs = _wd(kernels, options, workspace, room)
    label = src.name if src.workspace_known else f"{src.name}; workspace unknown, planned as 0"
    return tuple(MicroBatch(op=tk.op, kernel=tk.kernel.kind, sizes=c.sizes, algos=c.algos, time_s=c.time_s,
                            workspace_bytes=c.workspace_bytes, accumulator_bytes=c.accumulator_bytes, source=label,
                            module=tk.module) for tk, c in zip(kernels, configs))


def _accumulator(tk: TraceKernel) -> int:
    k = tk.kernel
    return accumulator_bytes(k.kind, k.weight_bytes, k.element_bytes)


def _wr(kernels: list[TraceKernel], options: dict, workspace: int, room: list[int]) -> list[Config]:
    """Each kernel's fastest configuration within its limit (and its op's headroom)."""
    done: dict[tuple, Config] = {}
    out = []
    for tk, free in zip(kernels, room):
        key = (tk.kernel, min(workspace, free))
        if key not in done:
            done[key] = _fits(best_config, options[tk.kernel], tk, key[1])
        out.append(done[key])
    return out


def _wd(kernels: list[TraceKernel], options: dict, workspace: int, room: list[int]) -> list[Config]:
    """One configuration per kernel, least total time with the total workspace within `workspace`."""
    fronts = {k: wd.pareto_front(options[k], k.n, _accumulator(tk)) for tk in kernels for k in [tk.kernel]}
    candidates = []
    for tk, free in zip(kernels, room):
        fitting = [c for c in fronts[tk.kernel] if c.memory_bytes <= free]
        if not fitting:
            raise MemplanError(f"op {tk.op} ({tk.kernel.describe()}): no configuration fits its "
                               f"{format_bytes(free)} of headroom under the budget")
        candidates.append(fitting)
    chosen = wd.solve(candidates, workspace)
    return [front[i] for front, i in zip(candidates, chosen)]


def _fits(optimise, options, tk: TraceKernel, limit: int) -> Config:
    try:
        return optimise(options, tk.kernel.n, limit, _accumulator(tk))
    except MemplanError:
        raise MemplanError(f"op {tk.op} ({tk.kernel.describe()}): no configuration fits "
                           f"{format_bytes(max(limit, 0))} of workspace") from None
