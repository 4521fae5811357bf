"""The former name of `memplan.pool.replay_allocator`, kept only while `memplan.workflows.allocators`
still imports it (memplan/workflows is being reorganised): new code imports replay_allocator."""

from .replay_allocator import install_cuda_allocator, installed_cuda_allocator

__all__ = ["install_cuda_allocator", "installed_cuda_allocator"]
