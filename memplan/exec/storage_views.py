"""Views over a storage's bytes, shared by every level of the executor.

The executors move and refill storages, never tensors: every holder of a storage (the
Parameter, the optimizer, tensors autograd saved and their views) sees the change because the
StorageImpl is the same object. These are the two ways they touch a storage's bytes: a
byte view to copy through (its version counter is its own, so autograd's saved-tensor checks
never see a copy) and adopting a storage a recomputation made into the one the plan dropped.
"""

from __future__ import annotations

import torch


def byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over all of `storage`, with a version counter of its own."""
    view = torch.empty(0, dtype=torch.uint8, device=storage.device)
    return view.set_(storage, 0, (storage.nbytes(),), (1,))


def adopt(home: torch.UntypedStorage, fresh: torch.UntypedStorage) -> None:
    """Move `fresh`'s bytes into `home` (empty): every tensor over `home` sees them."""
    if hasattr(home, "_swap_data_ptr_"):
        home._swap_data_ptr_(fresh)
        return
    home.resize_(fresh.nbytes())  # older PyTorch: one extra copy of the bytes
    byte_view(home).copy_(byte_view(fresh))
