"""What the executors' saved-tensor hooks keep of a tensor autograd saves: a detached alias.

A saved output kept as itself would hold its own autograd node: a cycle through autograd that
no collector frees when no backward releases the graph (a step an exception cut short, a
region's run stopped once it has what it wants). A detached alias shares the storage and drops
the history, as torch.utils.checkpoint's recompute keeps what it saves.
"""

from __future__ import annotations

import torch

_PYTHON_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)


def detached(t: torch.Tensor) -> torch.Tensor:
    """`t` without its history, for a saved-tensor pack hook to keep."""
    return t.detach()


def detached_unseen(t: torch.Tensor) -> torch.Tensor:
    """`detached`, out of a dispatch mode's sight (the interpreted executor's: it is not an op of the step)."""
    with torch._C._ExcludeDispatchKeyGuard(_PYTHON_KEY):
        return t.detach()


def same(t: torch.Tensor) -> torch.Tensor:
    """An unpack hook's answer: the alias kept (same storage, as autograd hands back its own)."""
    return t
