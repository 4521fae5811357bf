"""A plan's decisions as the simulator's columns, read from each Decision's packed row."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import random

import numpy as np

from memplan.model import Decision
from memplan.sim import _codes as K
from memplan.sim.decisions import DecisionArrays


def _decisions(n: int, seed: int = 0) -> list[Decision]:
    rng = random.Random(seed)
    out = []
    for sid in range(n):
        out_after, back = rng.randrange(0, 50), rng.randrange(0, 50)  # wrapping gaps too
        if rng.random() < 0.4:
            out.append(Decision(storage=sid, action="recompute", out_after=out_after, back_before=back))
        else:
            out.append(Decision(storage=sid, action="swap", out_after=out_after, back_before=back,
                                trigger=rng.choice([None, rng.randrange(0, 50)]), sync=rng.random() < 0.3,
                                overlap=rng.random() < 0.3, compress_ratio=rng.choice([None, 0.25, 1.0])))
    return out


def _columns_by_fields(decisions: list[Decision]) -> dict[str, list]:
    return {"storage": [d.storage for d in decisions], "recompute": [d.action == "recompute" for d in decisions],
            "out_after": [d.out_after for d in decisions], "back_before": [d.back_before for d in decisions],
            "prefetch_at": [d.prefetch_at for d in decisions],
            "sync": [K.SYNC * d.sync + K.OVERLAP * d.overlap for d in decisions],
            "ratio": [d.compress_ratio or 0.0 for d in decisions]}


def test_the_columns_are_the_decisions_fields_for_new_copied_and_unpickled_decisions():
    decisions = _decisions(200)
    # A worker's decisions arrive unpickled, and a replaced one is built anew: each must carry its own row.
    revived = [pickle.loads(pickle.dumps(d)) for d in decisions[:70]] + [copy.deepcopy(d) for d in decisions[70:140]] \
        + [dataclasses.replace(d, out_after=d.out_after + 1) for d in decisions[140:]]
    for group in (decisions, revived):
        arrays = DecisionArrays.of(group)
        for name, expected in _columns_by_fields(group).items():
            column = getattr(arrays, name)
            assert column.tolist() == expected, name
        assert arrays.storage.dtype == np.int64 and arrays.recompute.dtype == np.bool_
    assert revived[:140] == decisions[:140]


def test_no_decisions_give_empty_columns():
    arrays = DecisionArrays.of(())
    assert len(arrays) == 0 and arrays.prefetch_at.shape == (0,)
