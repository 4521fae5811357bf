"""What a convolution kernel can be run as: options per micro-batch size, and configurations.

An `Option` is one algorithm on one micro-batch size, with its time and workspace (from a
benchmark source or the database). A `Config` is mu-cuDNN's configuration: a list of
micro-batches, each with its algorithm; its time is the sum and its workspace the largest
(the micro-batches run one after another and share one workspace). Splitting a weight
gradient in PyTorch also holds a micro-batch's gradient (or an fp32 running sum) beside
the gradient: the `accumulator` bytes, charged to every configuration with more than one
micro-batch of a `bwd_filter` kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import MemplanError

POLICIES = ("all", "powerOfTwo", "undivided")


@dataclass(frozen=True, order=True)
class Option:
    """One algorithm run on one micro-batch."""

    time_s: float  # seconds of one run
    workspace_bytes: int  # its workspace (unknown ones are planned as 0: see memplan.conv.sources)
    algo: str  # algorithm name


@dataclass(frozen=True, kw_only=True)
class Config:
    """A kernel split into micro-batches, one algorithm each (mu-cuDNN's configuration)."""

    sizes: tuple[int, ...]  # micro-batch sizes, summing to the batch
    algos: tuple[str, ...]  # the algorithm of each
    time_s: float  # total seconds
    workspace_bytes: int  # largest workspace over the micro-batches
    accumulator_bytes: int = 0  # running-sum buffer of a split weight gradient

    @property
    def memory_bytes(self) -> int:
        """What the configuration holds beside the op's buffers (workspace plus accumulator)."""
        return self.workspace_bytes + self.accumulator_bytes


def policy_sizes(policy: str, batch: int) -> list[int]:
    """The micro-batch sizes a batch-size policy benchmarks (paper 003 §III-D).

    `powerOfTwo` also keeps the batch itself, so it is never worse than `undivided`.

    Raises:
        MemplanError: an unknown policy.
    """
    if policy == "all":
        return list(range(1, batch + 1))
    if policy == "powerOfTwo":
        return sorted({1 << k for k in range(batch.bit_length()) if 1 << k <= batch} | {batch})
    if policy == "undivided":
        return [batch]
    raise MemplanError(f"unknown batch-size policy {policy!r}; known: {', '.join(POLICIES)}")


def accumulator_bytes(kind: str, weight_bytes: int, element_bytes: int) -> int:
    """Bytes a split weight gradient holds beside the gradient itself (memplan.exec.microconv):
    one micro-batch's gradient while it is added; for 16-bit types instead the fp32 running sum
    (the micro-batch buffer then takes the place of the not yet written gradient). 0 for other kernels."""
    if kind != "bwd_filter":
        return 0
    fp32 = 4
    return weight_bytes * fp32 // element_bytes if element_bytes < fp32 else weight_bytes


def single(options: list[Option], limit: int) -> Option | None:
    """The fastest option within the workspace limit (None when none fits)."""
    fitting = [o for o in options if o.workspace_bytes <= limit]
    return min(fitting) if fitting else None
