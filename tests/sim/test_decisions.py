"""A plan's decisions as columns (memplan.sim.decisions): the reader that keeps each Decision object's
row gives the columns DecisionArrays.of reads, for new objects, for objects read before, for one
object twice in a plan, and after it started over when full."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memplan.model import Decision
from memplan.sim.decisions import DecisionArrays, DecisionReader

COLUMNS = ("storage", "recompute", "out_after", "back_before", "prefetch_at", "sync", "ratio")


def _decision(rng: random.Random) -> Decision:
    out = rng.randrange(20)
    back = rng.randrange(20)
    if rng.random() < 0.4:
        return Decision(storage=rng.randrange(50), action="recompute", out_after=out, back_before=back)
    return Decision(storage=rng.randrange(50), action="swap", out_after=out, back_before=back,
                    trigger=rng.choice((None, rng.randrange(20))), sync=rng.random() < 0.3,
                    overlap=rng.random() < 0.3, compress_ratio=rng.choice((None, 0.25, 1.0)))


def _same(a: DecisionArrays, b: DecisionArrays) -> None:
    for name in COLUMNS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), limit=st.sampled_from((5, 40, 10_000)))
def test_the_reader_gives_the_columns_of_the_decisions(seed, limit):
    rng = random.Random(seed)
    pool = [_decision(rng) for _ in range(60)]  # plans share these objects, as a search's do
    reader = DecisionReader(limit=limit)
    for _ in range(12):
        plan = tuple(rng.choice(pool) for _ in range(rng.randrange(0, 25)))
        _same(reader.of(plan), DecisionArrays.of(plan))


def test_a_decision_is_read_once_while_kept():
    rng = random.Random(0)
    plan = tuple(_decision(rng) for _ in range(10))
    reader = DecisionReader()
    reader.of(plan)
    reader.of(plan[3:] + plan[:3])
    assert len(reader._kept) == len(plan)
