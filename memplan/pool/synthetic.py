"""Synthetic pool problems of any size, for benchmarks and tests of large layouts.

Two families, both with many overlapping lifetimes (no time boundary splits them):

- `training`: one training iteration as a compiler would see it. A forward pass of `layers`
  steps writes activations that live until the mirrored backward step (nested lifetimes: the
  load peaks where forward turns into backward), every step also makes short-lived
  temporaries, the backward pass makes gradients that live until the optimizer step at the end,
  and a few buffers (weights, optimizer state) live the whole iteration.
- `uniform`: buffers with random starts over the horizon and log-uniform lifetimes and sizes
  (the shape of minimalloc's random benchmarks, at scale).

Sizes are multiples of 512 bytes (CUDA allocators round to 512 B), log-uniform over several
orders of magnitude, as tensor sizes in one model are.
"""

from __future__ import annotations

import numpy as np

from .problem import PoolProblem, make_problem

ALIGN = 512  # bytes: every size is a multiple of this
FAMILIES = ("training", "uniform")
PERSISTENT_SHARE = 0.002  # share of buffers alive the whole iteration (training)
ACTIVATION_SHARE = 0.3  # share of buffers that are activations kept for the backward pass
GRADIENT_SHARE = 0.05  # share of buffers that are gradients kept until the optimizer step
TEMP_MEAN_STEPS = 3.0  # mean lifetime of a temporary, in steps
BUFFERS_PER_STEP = 8  # buffers created per step on average (sets the horizon)


def _sizes(rng: np.random.Generator, n: int, low: float, high: float) -> np.ndarray:
    """n log-uniform sizes in [low, high) bytes, rounded up to ALIGN."""
    raw = np.exp(rng.uniform(np.log(low), np.log(high), n))
    return (np.ceil(raw / ALIGN) * ALIGN).astype(np.int64)


def training_problem(n: int, seed: int = 0) -> PoolProblem:
    """A training-iteration-like problem with about `n` buffers (see the module docstring)."""
    rng = np.random.default_rng(seed)
    steps = max(4, n // BUFFERS_PER_STEP)
    half = steps // 2
    counts = {"persistent": max(1, int(n * PERSISTENT_SHARE)), "activation": int(n * ACTIVATION_SHARE),
              "gradient": int(n * GRADIENT_SHARE)}
    counts["temp"] = n - sum(counts.values())
    starts, ends, sizes = [], [], []
    k = counts["persistent"]
    starts.append(np.zeros(k, np.int64)), ends.append(np.full(k, steps + 1)), sizes.append(_sizes(rng, k, 2**20, 2**26))
    k = counts["activation"]
    made = rng.integers(0, half, k)
    used = 2 * half - made + rng.integers(0, 3, k)  # freed after its mirrored backward step
    starts.append(made), ends.append(np.minimum(used, steps) + 1), sizes.append(_sizes(rng, k, 2**12, 2**24))
    k = counts["gradient"]
    made = rng.integers(half, steps, k)
    starts.append(made), ends.append(np.full(k, steps + 1)), sizes.append(_sizes(rng, k, 2**12, 2**22))
    k = counts["temp"]
    made = rng.integers(0, steps, k)
    used = np.minimum(made + rng.geometric(1 / TEMP_MEAN_STEPS, k), steps)  # the iteration ends at step `steps`
    starts.append(made), ends.append(used + 1), sizes.append(_sizes(rng, k, 2**10, 2**24))
    return make_problem(np.concatenate(starts), np.concatenate(ends), np.concatenate(sizes), source=f"training:{n}:{seed}")


def uniform_problem(n: int, seed: int = 0) -> PoolProblem:
    """`n` buffers with random starts, log-uniform lifetimes (1 step to a tenth of the horizon)
    and log-uniform sizes (1 KiB to 16 MiB)."""
    rng = np.random.default_rng(seed)
    steps = max(4, n // BUFFERS_PER_STEP)
    starts = rng.integers(0, steps, n)
    lengths = np.exp(rng.uniform(0, np.log(max(2, steps // 10)), n)).astype(np.int64) + 1
    return make_problem(starts, starts + lengths, _sizes(rng, n, 2**10, 2**24), source=f"uniform:{n}:{seed}")


def synthetic_problem(family: str, n: int, seed: int = 0) -> PoolProblem:
    """A problem of `family` (one of FAMILIES) with about `n` buffers."""
    if family not in FAMILIES:
        raise ValueError(f"unknown synthetic family {family!r}; known: {', '.join(FAMILIES)}")
    return training_problem(n, seed) if family == "training" else uniform_problem(n, seed)
