"""The memory meter (memplan.exec.meter) against what it must not miss."""

from __future__ import annotations

import torch

from memplan.exec.meter import MemoryMeter


def test_no_new_storage_takes_the_address_of_a_dead_one_the_meter_still_lists():
    """Issue 51's finding 14 is not real, and this is why: the meter keys storages by address and skips a
    storage whose address its table holds, which would miss a new storage at a dead one's address; but its
    weak reference keeps the dead StorageImpl allocated (c10's weak_intrusive_ptr) until the entry goes, so
    no new storage can have that address (without the meter, glibc hands a freed StorageImpl's address to
    the next one of its size most of the time)."""
    meter = MemoryMeter("cpu")
    for _ in range(50):
        old = torch.empty(256)
        meter.track(old)
        key = old.untyped_storage()._cdata
        del old
        new = torch.empty(1024)
        assert new.untyped_storage()._cdata != key
        meter.track(new)
        assert meter.live_bytes() == 4096
        del new
    meter.close()
