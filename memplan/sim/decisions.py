"""A plan's decisions as columns: what the simulator reads of them, extracted once per plan.

Search planners simulate thousands of plans of a few hundred decisions each; reading every
field of every Decision in Python for each step of the preparation (lowering, chains, the
kernel's arrays) cost more than the simulation itself. The columns are read once and every
later step works on arrays.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from . import _codes as K

NO_TRIGGER = -1  # placeholder for Decision.trigger None while extracting fields
_FIELDS = 7  # values read per decision


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
        # One flat iterator: numpy converts it much faster than a list of tuples.
        fields = np.fromiter(itertools.chain.from_iterable(
            (d.storage, d.action == "recompute", d.out_after, d.back_before,
             NO_TRIGGER if d.trigger is None else d.trigger, d.sync + K.OVERLAP * d.overlap, d.compress_ratio or 0.0)
            for d in decisions), dtype=np.float64, count=_FIELDS * len(decisions)).reshape(-1, _FIELDS)
        storage, recompute, out_after, back, trigger, sync = (fields[:, j].astype(np.int64) for j in range(6))
        recompute = recompute.astype(np.bool_)
        prefetch_at = np.where((trigger == NO_TRIGGER) | recompute, back, trigger)
        return cls(storage=storage, recompute=recompute, out_after=out_after, back_before=back,
                   prefetch_at=prefetch_at, sync=sync, ratio=fields[:, 6].copy())

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


READ_KEPT = 1 << 17  # Decision objects whose columns a reader keeps (bounds its memory: it starts over when full)
_INT_COLUMNS = 6  # storage, recompute, out_after, back_before, prefetch_at, sync: DecisionArrays's integer columns


class DecisionReader:
    """Reads plans' decisions into columns (DecisionArrays), each Decision object once while it is kept.

    A search builds its plans from the same Decision objects (HOME's decoder makes one per feature map,
    action and trigger and reuses it; a local search's move replaces one decision of its plan), and
    reading a few hundred Decisions' fields in Python cost as much as lowering the plan. A Decision is
    frozen, so its row is read once and then found by the object's identity (the reader holds the
    object, so that identity is not reused while the row is kept).
    """

    def __init__(self, limit: int = READ_KEPT):
        self._limit = limit
        self._slot: dict[int, int] = {}  # id(decision) -> its column in the tables
        self._kept: list = []  # the decisions read, by column (alive while their identity is a key)
        self._ints = np.zeros((_INT_COLUMNS, 256), dtype=np.int64)
        self._ratio = np.zeros(256)

    def of(self, decisions) -> DecisionArrays:
        """The columns of `decisions` (a sequence of memplan.model.Decision): DecisionArrays.of's."""
        slots = list(map(self._slot.get, map(id, decisions)))
        if None in slots:
            slots = self._read(decisions, slots)
        index = np.fromiter(slots, dtype=np.int64, count=len(slots))
        ints = self._ints[:, index]  # one contiguous row a column
        return DecisionArrays(storage=ints[0], recompute=ints[1].astype(np.bool_), out_after=ints[2],
                              back_before=ints[3], prefetch_at=ints[4], sync=ints[5], ratio=self._ratio[index])

    def _read(self, decisions, slots: list) -> list:
        """`slots` with the decisions not read yet read into new columns."""
        new = [j for j, slot in enumerate(slots) if slot is None]
        if len(self._kept) + len(new) > self._limit:  # start over
            self._slot.clear()
            self._kept.clear()
            slots, new = [None] * len(decisions), list(range(len(decisions)))
        start, end = len(self._kept), len(self._kept) + len(new)
        if end > self._ratio.shape[0]:
            size = max(end, 2 * self._ratio.shape[0])
            self._ints = np.concatenate([self._ints, np.zeros((_INT_COLUMNS, size - self._ints.shape[1]),
                                                              dtype=np.int64)], axis=1)
            self._ratio = np.concatenate([self._ratio, np.zeros(size - self._ratio.shape[0])])
        a = DecisionArrays.of([decisions[j] for j in new])
        for row, column in enumerate((a.storage, a.recompute, a.out_after, a.back_before, a.prefetch_at, a.sync)):
            self._ints[row, start:end] = column
        self._ratio[start:end] = a.ratio
        for slot, j in enumerate(new, start):
            slots[j] = slot
            self._slot[id(decisions[j])] = slot
            self._kept.append(decisions[j])
        return slots
