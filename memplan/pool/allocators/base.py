"""The allocator registry: what an allocator function returns, and the decorator that registers it.

Every module of this package is found by the registry (memplan.registry says why planners,
allocators and commands all register this way).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...registry import Registry


@dataclass(frozen=True, kw_only=True)
class AllocatorOutcome:
    """What one allocator function returns."""

    footprint_bytes: int  # pool size (offline) or peak reserved memory (online)
    offsets: np.ndarray | None = None  # byte offset per buffer; None when the allocator has no single address space
    alloc_calls: int = 1  # device allocation calls (cudaMalloc) it makes per iteration
    details: dict = field(default_factory=dict)  # allocator-specific facts (winning order, optimality, ...)


AllocatorFn = Callable[..., AllocatorOutcome]  # fn(problem, *, time_limit_s, seed) -> AllocatorOutcome


@dataclass(frozen=True, kw_only=True)
class AllocatorSpec:
    """One registered allocator."""

    name: str  # e.g. "smartpool"
    fn: AllocatorFn  # the allocator
    summary: str  # one line for `memplan pool`'s help


ALLOCATORS: Registry[AllocatorSpec] = Registry("allocator", "memplan.pool.allocators")


def register_allocator(name: str, summary: str) -> Callable[[AllocatorFn], AllocatorFn]:
    """Decorator: make `fn` available as allocator `name`."""

    def wrap(fn: AllocatorFn) -> AllocatorFn:
        ALLOCATORS.add(name, AllocatorSpec(name=name, fn=fn, summary=summary))
        return fn

    return wrap


def known_allocators() -> dict[str, str]:
    """Allocator names with a one-line summary each."""
    return {name: spec.summary for name, spec in ALLOCATORS.entries().items()}
