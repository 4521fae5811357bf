"""Hypothesis profiles for the property suites (loaded before any test module is imported).

- `memplan` (the default): a small, reproducible example budget, so `make test` stays fast
  and gives the same examples on every run; `MEMPLAN_FUZZ_EXAMPLES=N` asks for N examples
  per property instead, drawn at random (the convention of tests/project/test_fuzz_user_input.py).
- `ci-long` (`pytest --hypothesis-profile ci-long`): many random examples, for a run by hand.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

DEFAULT_EXAMPLES = 12  # per property (and per planner in tests/planners/test_planner_property.py)
LONG_EXAMPLES = 300
_EXAMPLES = os.environ.get("MEMPLAN_FUZZ_EXAMPLES")

settings.register_profile(
    "memplan", max_examples=int(_EXAMPLES or DEFAULT_EXAMPLES), derandomize=_EXAMPLES is None, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci-long", parent=settings.get_profile("memplan"), max_examples=LONG_EXAMPLES,
                          derandomize=False)
settings.load_profile("memplan")


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module of small training steps: many small ops, which a second
    thread only slows down (on a busy 2-core host, twentyfold)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
