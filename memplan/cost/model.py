"""Per-op durations and copy times: measured where the trace has them, else a roofline.

The roofline prices an op at the peak of the precision it runs in: its dtype (BF16, FP16), and
for FP32 the TF32 tensor-core peak where the math settings the trace recorded allow TF32 for it
(`trace.meta["math"]`: cuDNN's flag for convolutions, cuBLAS's for every other op with FLOPs,
i.e. matmuls and attention). A trace without them (older files) is priced in FP32, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import Trace
from .profiles import DeviceProfile, get_profile

CONVOLUTION = "convolution"  # in the name of every aten convolution op (forward, backward, cuDNN's own)


@dataclass(frozen=True, eq=False)
class Cost:
    """Everything time-related a planner or the simulator needs for one trace on one device."""

    profile: DeviceProfile  # the device the times are for
    durations: np.ndarray  # seconds per op (float64, indexed by op index)
    host_in_durations: bool = False  # the durations were measured as wall time with the host's work in them
    # The host's work is priced for a traced PyTorch step (what memplan's executor runs); a trace from
    # elsewhere (a DTR log, a memory snapshot, a problem built by hand) is the device's work alone.
    priced_host: bool = False
    # The step is replayed as a captured CUDA graph, which joins every copy at its end (memplan.exec.graphed):
    # no swap-out is carried over to the next step (memplan.sim.simulate).
    captured: bool = False

    @property
    def host_op_s(self) -> float:
        """Host work per op beside its duration (none where the durations hold it already)."""
        return 0.0 if self.host_in_durations or not self.priced_host else self.profile.host_op_s

    def executor_s(self, what: str) -> float:
        """The executor's host work per `what` ("hook", "hook_call", "mode_op", "guard_op", "replay_op",
        "record_op", "action", "region" or "stretch"), if priced."""
        return getattr(self.profile, f"{what}_s") if self.priced_host else 0.0

    def carried(self, durations: np.ndarray) -> "Cost":
        """This cost model with other durations (a view of the trace), pricing the host as this one does."""
        return Cost(profile=self.profile, durations=durations, host_in_durations=self.host_in_durations,
                    priced_host=self.priced_host, captured=self.captured)

    @property
    def host_async(self) -> bool:
        """A GPU's host issues work ahead of the device; the CPU is its own device (its copies too)."""
        return self.profile.kind != "cpu" or not self.priced_host

    @classmethod
    def for_trace(cls, trace: Trace, profile: str | DeviceProfile, allow_tf32: bool | None = None) -> "Cost":
        """Durations for every op of `trace` on the device of `profile`. Code below the edge takes
        the Cost of its `memplan.problem.Problem` instead of calling this.

        Args:
            trace: the trace; ops with a measured `duration_s` keep it.
            profile: a profile name, profile file or DeviceProfile.
            allow_tf32: price FP32 matmuls/convs at the TF32 tensor-core rate (True) or the FP32 one
                (False); None: as the math settings recorded in the trace say (`uses_tf32`).
        """
        profile = get_profile(profile)
        math = trace.meta.get("math")
        durations = np.array([
            op.duration_s if op.duration_s is not None
            else roofline_s(op.flops, op.bytes_accessed, _dtype_of(trace, op), profile,
                            uses_tf32(op.name, math) if allow_tf32 is None else allow_tf32)
            for op in trace.ops], dtype=np.float64)
        # CPU op times measured over whole iterations hold the host's work (memplan.tracing.optimes)
        wall = bool(trace.meta.get("time_repeats")) and all(op.duration_s is not None for op in trace.ops)
        return cls(profile=profile, durations=durations, host_in_durations=wall,
                   priced_host=trace.meta.get("source") == "tracer")

    def d2h_s(self, nbytes: float) -> float:
        """Seconds to copy `nbytes` device-to-host over the link (pinned memory)."""
        return self.profile.copy_latency_s + nbytes / (self.profile.d2h_bytes_per_s * self.profile.link_efficiency)

    def h2d_s(self, nbytes: float) -> float:
        """Seconds to copy `nbytes` host-to-device over the link (pinned memory)."""
        return self.profile.copy_latency_s + nbytes / (self.profile.h2d_bytes_per_s * self.profile.link_efficiency)

    def memory_pass_s(self, nbytes: float) -> float:
        """Seconds for one kernel that reads and writes `nbytes` (e.g. compression)."""
        return self.profile.launch_s + 2 * nbytes / (self.profile.hbm_bytes_per_s * self.profile.memory_efficiency)

    @property
    def baseline_compute_s(self) -> float:
        """Sum of all op durations: the unconstrained iteration time."""
        return float(self.durations.sum())


def roofline_s(flops: float, nbytes: float, dtype: str | None, profile: DeviceProfile,
               allow_tf32: bool = False) -> float:
    """Roofline estimate: max(compute time, memory time) plus one launch.

    Ops that neither compute nor touch memory (views, metadata) cost nothing.
    """
    if flops <= 0 and nbytes <= 0:
        return 0.0
    compute = flops / (profile.peak_flops(dtype, allow_tf32) * profile.compute_efficiency)
    memory = nbytes / (profile.hbm_bytes_per_s * profile.memory_efficiency)
    return max(compute, memory) + profile.launch_s


def uses_tf32(op_name: str, math: dict | None) -> bool:
    """Whether an FP32 op may run on TF32 tensor cores under the recorded math settings: a
    convolution (forward or backward) when cuDNN allows TF32, any other op when cuBLAS does."""
    if not math:
        return False
    return bool(math.get("cudnn_tf32" if CONVOLUTION in op_name else "matmul_tf32"))


def _dtype_of(trace: Trace, op) -> str | None:
    """The dtype an op computes in: that of its first written storage, where known."""
    for sid in op.writes:
        dtype = trace.storages[sid].dtype
        if dtype:
            return dtype
    return None
