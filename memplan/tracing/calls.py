"""How a step's hook points are numbered, shared by the tracer (which records them) and the
executor (which must find the same keys at run time).

A point is (kind, name, occurrence): the k-th forward call of a module is occurrence k of
"fwd_pre"; its "fwd_post" and "bwd" carry the same k, found on a stack of the calls still
running (a module may be called again from inside itself).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._pytree import tree_leaves


class CallNumbering:
    """Occurrence numbers of one step's points, per (kind, name)."""

    def __init__(self):
        self._counts: Counter = Counter()
        self._open: dict[str, list[int]] = {}  # module path -> occurrences of its calls still running

    def next(self, kind: str, name: str) -> int:
        """The occurrence of this point of (kind, name), counting from 0 in the step."""
        n = self._counts[(kind, name)]
        self._counts[(kind, name)] += 1
        return n

    def enter(self, path: str) -> int:
        """A forward call of module `path` starts; returns its occurrence."""
        n = self.next("fwd_pre", path)
        self._open.setdefault(path, []).append(n)
        return n

    def leave(self, path: str) -> int | None:
        """The innermost running call of `path` ends; returns its occurrence (None: none ran)."""
        calls = self._open.get(path)
        return calls.pop() if calls else None


def on_backward(output, callback: Callable[[], None]) -> None:
    """Call `callback()` when the first gradient of `output`'s tensors is ready, i.e. when the
    backward of the call that produced it starts (nothing when grad mode is off)."""
    if not torch.is_grad_enabled():
        return
    tensors = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
    if tensors:
        register_multi_grad_hook(tensors, lambda grad: callback(), mode="any")
