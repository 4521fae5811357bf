"""Particle chunks run in worker processes (or in this one): Algorithm 3 updates every particle
from the same P1 and its own history, so the particles of one iteration are independent.

Each worker owns a contiguous block of particles for the whole search, with its own copy of
the evaluator (forked, so nothing is pickled) and so its own memo. The blocks are contiguous
and ties go to the lowest particle index, so the result does not depend on the number of
workers. Processes, not threads: the simulator's plan preparation is Python and holds the GIL
(benchmarks/joint.py measures both).
"""

from __future__ import annotations

import multiprocessing
import os
import traceback

import numpy as np

from .pso import Chunk, Score


def available_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class LocalChunk:
    """A chunk run in this process when collected."""

    def __init__(self, score: Score, policies: np.ndarray):
        self.chunk = Chunk(score=score, policies=policies.copy())
        self.pending = None

    def submit(self, method: str, *args) -> None:
        """Queue `Chunk.<method>(*args)`."""
        self.pending = (method, args)

    def collect(self) -> dict:
        """Run the queued call and return its report."""
        method, args = self.pending
        return getattr(self.chunk, method)(*args)

    def close(self) -> None:
        """Nothing to release."""


class ProcessChunk:
    """A chunk run by a forked worker process."""

    def __init__(self, ctx, score: Score, policies: np.ndarray):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, score, policies), daemon=True)
        self.proc.start()
        child.close()

    def submit(self, method: str, *args) -> None:
        """Send `Chunk.<method>(*args)` to the worker."""
        self.conn.send((method, args))

    def collect(self) -> dict:
        """The worker's report (its error re-raised here)."""
        kind, value = self.conn.recv()
        if kind == "error":
            raise RuntimeError(f"particle worker failed:\n{value}")
        return value

    def close(self) -> None:
        """Stop the worker."""
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.terminate()
        self.conn.close()


def _serve(conn, score: Score, policies: np.ndarray) -> None:
    chunk = Chunk(score=score, policies=policies)
    while (message := conn.recv()) is not None:
        method, args = message
        try:
            conn.send(("ok", getattr(chunk, method)(*args)))
        except Exception:  # noqa: BLE001 - reported to the parent, which raises it
            conn.send(("error", traceback.format_exc()))


def make_chunks(score: Score, policies: np.ndarray, workers: int) -> list:
    """Contiguous blocks of `policies`, one per worker (processes when `workers` > 1 and fork exists)."""
    workers = max(1, min(workers, len(policies)))
    blocks = np.array_split(policies, workers)
    if workers == 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [LocalChunk(score, policies)]
    ctx = multiprocessing.get_context("fork")
    return [ProcessChunk(ctx, score, block) for block in blocks]
