"""mu-cuDNN's optimisers and planners: WR's DP against brute force, WD's ILP with and without
Pareto pruning, the planners under the shared conformance tests (alone and composed with a
swap planner), and their parameters."""

import itertools
import json
import random
from typing import ClassVar

import numpy as np
import pytest
import torch

from memplan.conv import wd
from memplan.conv.options import Config, Option, policy_sizes
from memplan.conv.wr import best_config
from memplan.errors import MemplanError
from memplan.model import Plan
from memplan.planners.base import get_planner
from memplan.planners.base import plan as make_plan
from memplan.testing.conformance import PlannerConformance
from memplan.tracing.fake import new_fake_mode
from memplan.tracing.tracer import trace as trace_step

MIB = 2**20


# --- brute force: every configuration of a small kernel -------------------------------------------


def _random_options(rng, batch, policy="all", algos=3):
    """Per size, a few algorithms: time roughly linear in the size, workspace growing with it."""
    out = {}
    for b in policy_sizes(policy, batch):
        out[b] = [Option(time_s=rng.uniform(0.5, 2.0) * (1e-4 + b * rng.uniform(1e-5, 4e-5)),
                         workspace_bytes=int(b * rng.choice((0, 1, 3, 8)) * MIB), algo=f"a{j}")
                  for j in range(algos)]
    return out


def _all_configs(options, batch, accumulator=0):
    """Every multiset of (size, algorithm) micro-batches summing to `batch`."""
    items = [(b, o) for b, opts in options.items() for o in opts]
    out = []

    def extend(start, left, parts):
        if left == 0:
            split = len(parts) > 1
            out.append(Config(sizes=tuple(b for b, _ in parts), algos=tuple(o.algo for _, o in parts),
                              time_s=sum(o.time_s for _, o in parts),
                              workspace_bytes=max(o.workspace_bytes for _, o in parts),
                              accumulator_bytes=accumulator if split else 0))
            return
        for i in range(start, len(items)):
            if items[i][0] <= left:
                extend(i, left - items[i][0], parts + [items[i]])

    extend(0, batch, [])
    return out


@pytest.mark.parametrize("seed", range(6))
def test_wr_dp_equals_brute_force(seed):
    rng = random.Random(seed)
    batch = rng.randrange(2, 9)
    accumulator = rng.choice((0, 2 * MIB))
    for policy in ("all", "powerOfTwo", "undivided"):
        options = _random_options(rng, batch, policy)
        configs = _all_configs(options, batch, accumulator)
        for limit in (0, MIB, 4 * MIB, 16 * MIB, 64 * MIB):
            fitting = [c for c in configs if c.memory_bytes <= limit]
            if not fitting:
                with pytest.raises(MemplanError):
                    best_config(options, batch, limit, accumulator)
                continue
            got = best_config(options, batch, limit, accumulator)
            assert got.time_s == pytest.approx(min(c.time_s for c in fitting), rel=1e-12)
            assert got.memory_bytes <= limit and sum(got.sizes) == batch


@pytest.mark.parametrize("seed", range(6))
def test_the_pareto_front_is_every_undominated_configuration(seed):
    rng = random.Random(100 + seed)
    batch = rng.randrange(2, 8)
    options = _random_options(rng, batch)
    configs = _all_configs(options, batch, accumulator=MIB)
    front = wd.pareto_front(options, batch, accumulator=MIB)
    points = {(round(c.time_s, 15), c.memory_bytes) for c in wd.prune(configs)}
    assert {(round(c.time_s, 15), c.memory_bytes) for c in front} == points


@pytest.mark.parametrize("seed", range(8))
def test_wd_ilp_with_and_without_pruning_has_the_same_optimum(seed):
    rng = random.Random(200 + seed)
    kernels = [_random_options(rng, b) for b in (rng.randrange(2, 6) for _ in range(rng.randrange(2, 5)))]
    everything = [_all_configs(o, max(o)) for o in kernels]
    fronts = [wd.pareto_front(o, max(o)) for o in kernels]
    assert sum(map(len, fronts)) < sum(map(len, everything))
    smallest = sum(min(c.memory_bytes for c in f) for f in everything)
    for limit in (smallest, smallest + 4 * MIB, smallest + 32 * MIB, 10**12):
        full = wd.solve(everything, limit)
        pruned = wd.solve(fronts, limit)
        best = sum(f[i].time_s for f, i in zip(everything, full))
        assert sum(f[i].time_s for f, i in zip(fronts, pruned)) == pytest.approx(best, rel=1e-9)
        assert sum(f[i].memory_bytes for f, i in zip(fronts, pruned)) <= limit
        # the optimum against every choice, exhaustively
        exact = min((sum(c.time_s for c in pick) for pick in itertools.product(*everything)
                     if sum(c.memory_bytes for c in pick) <= limit), default=None)
        assert best == pytest.approx(exact, rel=1e-9)
    with pytest.raises(MemplanError, match="below"):
        wd.solve(fronts, smallest - 1)


def test_wd_plans_a_trace_without_convolutions():
    # Found by the planner property suite: HiGHS refuses an ILP with no variables.
    from memplan.testing.synthetic import chain_trace

    made = make_plan(chain_trace(4), None, planner="ucudnn:wd")
    assert wd.solve([], 0) == [] and made.microbatches == ()


def test_wd_is_never_slower_than_wr_at_the_same_total_workspace():
    rng = random.Random(7)
    kernels = [_random_options(rng, 6) for _ in range(4)]
    for limit in (MIB, 8 * MIB, 32 * MIB):
        wr_time = sum(best_config(o, 6, limit).time_s for o in kernels)
        fronts = [wd.pareto_front(o, 6) for o in kernels]
        pick = wd.solve(fronts, limit * len(kernels))
        assert sum(f[i].time_s for f, i in zip(fronts, pick)) <= wr_time * (1 + 1e-12)


# --- the planners ------------------------------------------------------------------------------------


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                                        torch.nn.Conv2d(32, 32, 5, padding=2), torch.nn.ReLU(),
                                        torch.nn.Conv2d(32, 16, 3, stride=2, padding=1))
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.body(x).mean(dim=(2, 3)))


def cnn_trace(batch=32, side=32):
    with new_fake_mode():
        net, x = SmallCNN(), torch.randn(batch, 3, side, side)
        y = torch.randint(0, 10, (batch,))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def step(x, y):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    return trace_step(step, x, y, fake=True, model=net, optimizer=opt)


class TestUcudnnWR(PlannerConformance):
    planner = "ucudnn:wr"
    traces: ClassVar[list] = [cnn_trace]
    budgets: ClassVar[list] = ["110%", "100%", "90%"]
    device = "v100"


class TestUcudnnWD(PlannerConformance):
    planner = "ucudnn:wd"
    params: ClassVar[dict] = {"workspace": 16 * MIB, "policy": "all"}
    traces: ClassVar[list] = [cnn_trace]
    budgets: ClassVar[list] = ["110%", "100%", "90%"]
    device = "v100"


class TestComposedWithAutoSwap(PlannerConformance):
    planner = "autoswap:doa+ucudnn:wd"
    params: ClassVar[dict] = {"workspace": 64 * MIB, "min_bytes": 0}
    traces: ClassVar[list] = [cnn_trace]
    budgets: ClassVar[list] = ["100%", "80%", "60%"]
    device = "v100"


@pytest.fixture(scope="module")
def cnn():
    return cnn_trace()


def test_every_conv_kernel_is_decided_and_the_plan_charges_its_workspaces(cnn):
    got = make_plan(cnn, "150%", planner="ucudnn:wr", profile="v100", workspace="64MiB")
    kernels = sorted((op.index, k) for op in cnn.ops if op.conv is not None for k in op.conv.kernels)
    assert sorted((m.op, m.kernel) for m in got.microbatches) == kernels
    assert all(m.source == "model:v100" and m.workspace_bytes <= 64 * MIB for m in got.microbatches)
    assert got.predicted["peak_load_bytes"] >= cnn.peak_load_bytes
    again = Plan.from_json(json.loads(json.dumps(got.to_json())))
    assert again.microbatches == got.microbatches


def test_a_composed_plan_fits_its_budget_with_the_workspaces(cnn):
    budget = int(0.8 * cnn.peak_load_bytes)  # autoswap:doa alone needs 74%
    got = make_plan(cnn, budget, planner="autoswap:doa+ucudnn:wr", profile="v100", min_bytes=0, workspace="32MiB")
    assert got.decisions and got.microbatches
    assert got.predicted["feasible"] and got.predicted["peak_load_bytes"] <= budget
    assert max(m.workspace_bytes for m in got.microbatches) > 0


def test_planner_parameters_are_typed_and_checked(cnn):
    spec = get_planner("ucudnn:wd")
    assert spec.describe()["params"]["workspace"] == {"type": "ByteSize", "default": 64 * MIB}
    small = make_plan(cnn, "150%", planner="ucudnn:wr", profile="v100", workspace=0)
    assert all(m.workspace_bytes == 0 for m in small.microbatches)
    for bad, message in (({"workspace": "lots"}, "byte size"), ({"policy": "some"}, "policy"),
                         ({"source": "tpu"}, "source")):
        with pytest.raises(MemplanError, match=message):
            make_plan(cnn, "150%", planner="ucudnn:wr", profile="v100", **bad)
    with pytest.raises(MemplanError, match="compose"):
        get_planner("smartpool+ucudnn:wd")
    assert np.isfinite(make_plan(cnn, None, planner="none+ucudnn:wd", profile="v100").predicted["time_s"])
