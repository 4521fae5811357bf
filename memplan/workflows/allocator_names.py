"""The CUDA allocators a run can use, by name: apart from memplan.workflows.allocators, which
imports torch, so that the command line can offer them without importing it."""

from __future__ import annotations

from ..vocabulary import Vocabulary


class AllocatorMode(Vocabulary):
    """The CUDA allocator a run uses (`memplan run --allocator`)."""

    AUTO = "auto"  # chosen for the run (memplan.workflows.allocators.choose_allocator)
    CACHING = "caching"  # PyTorch's caching allocator as configured
    EXPANDABLE = "expandable"  # the same with expandable segments
    POOL = "pool"  # the plan's layout, served by memplan's replay allocator
