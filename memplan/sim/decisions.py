"""A plan's decisions as columns: what the simulator reads of them, extracted once per plan.

Search planners simulate thousands of plans of a few hundred decisions each; reading every
field of every Decision in Python for each step of the preparation (lowering, chains, the
kernel's arrays) cost more than the simulation itself. The columns are read once and every
later step works on arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.plan import NO_TRIGGER, ROW
from . import _codes as K

ROW_FIELDS = ROW.size // 8  # float64 values in a Decision's row


@dataclass(frozen=True, kw_only=True)
class DecisionArrays:
    """Decisions as columns, one row a decision, in plan order."""

    storage: np.ndarray  # int64: the storage id
    recompute: np.ndarray  # bool: a recompute decision (else a swap)
    out_after: np.ndarray  # int64: Decision.out_after
    back_before: np.ndarray  # int64: Decision.back_before
    prefetch_at: np.ndarray  # int64: Decision.prefetch_at (the trigger; back_before for a recompute)
    sync: np.ndarray  # int64: K.SYNC and K.OVERLAP bits of Decision.sync and Decision.overlap
    ratio: np.ndarray  # float64: Decision.compress_ratio, 0.0 when off

    @classmethod
    def of(cls, decisions) -> DecisionArrays:
        """The columns of `decisions` (a sequence of memplan.model.Decision)."""
        fields = np.frombuffer(b"".join([d.row for d in decisions]), dtype=np.float64).reshape(-1, ROW_FIELDS)
        storage, recompute, out_after, back, trigger, sync, overlap = (fields[:, j].astype(np.int64) for j in range(7))
        recompute = recompute.astype(np.bool_)
        prefetch_at = np.where((trigger == NO_TRIGGER) | recompute, back, trigger)
        return cls(storage=storage, recompute=recompute, out_after=out_after, back_before=back,
                   prefetch_at=prefetch_at, sync=sync * K.SYNC + overlap * K.OVERLAP, ratio=fields[:, 7].copy())

    def __len__(self) -> int:
        return len(self.storage)

    def take(self, index: np.ndarray) -> DecisionArrays:
        """The rows `index` (positions or a mask), in that order."""
        return DecisionArrays(storage=self.storage[index], recompute=self.recompute[index],
                              out_after=self.out_after[index], back_before=self.back_before[index],
                              prefetch_at=self.prefetch_at[index], sync=self.sync[index], ratio=self.ratio[index])

    @property
    def swap(self) -> np.ndarray:
        """bool: a swap decision."""
        return ~self.recompute

    @property
    def wraps(self) -> np.ndarray:
        """bool: a gap across the iteration boundary (Decision.wraps)."""
        return self.back_before <= self.out_after
