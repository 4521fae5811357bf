"""The random generators' and autocast's state an op or module call ran under, captured and put back.

Both executors' recomputations run again what the step ran (the interpreted one an op,
memplan.exec.op_replay; the hooked one a module call, memplan.exec.rerun), and must draw the same
random numbers and cast to the same precision as the first run, as torch.utils.checkpoint's
recompute does (`get_device_states`, `_get_autocast_kwargs`, under `torch.random.fork_rng`): the CPU
generator always and, on a GPU, the CUDA device's; autocast's flag and dtype for the device's type.
The generators' states from before a run are put back after it, so a recomputation draws nothing
from the step's sequence.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RngState:
    """The states of the generators a run on `device` draws from."""

    cpu: torch.Tensor  # the CPU generator's state
    device: torch.device | None  # the CUDA device whose generator is held (None: a run on the CPU)
    cuda: torch.Tensor | None  # that generator's state

    @classmethod
    def of(cls, device: torch.device) -> RngState:
        """The generators' states now, for a run on `device`."""
        if device.type == "cuda":
            return cls(torch.get_rng_state(), device, torch.cuda.get_rng_state(device))
        return cls(torch.get_rng_state(), None, None)

    def apply(self) -> None:
        """Set the generators to these states."""
        torch.set_rng_state(self.cpu)
        if self.device is not None:
            torch.cuda.set_rng_state(self.cuda, self.device)

    @contextlib.contextmanager
    def restored(self):
        """Run under these states; the generators' states from before come back after."""
        before = RngState.of(self.device or torch.device("cpu"))
        self.apply()
        try:
            yield
        finally:
            before.apply()


@dataclass(frozen=True)
class AutocastState:
    """Whether autocast ran, and at which dtype, for one device type."""

    device_type: str  # "cpu", "cuda"
    enabled: bool  # autocast was on
    dtype: torch.dtype  # the dtype it casts to

    @classmethod
    def of(cls, device: torch.device) -> AutocastState:
        """Autocast's state now, for `device`'s type."""
        kind = device.type
        return cls(kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))

    def entered(self):
        """A context that runs under this state."""
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)
