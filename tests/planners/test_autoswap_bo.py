"""autoswap:bo (paper 000 §IV-C): never worse than the four pure scores; seedable."""

import pytest

from memplan.cost.model import Cost
from memplan.errors import MemplanError
from memplan.planners.autoswap import bo as _autoswap_bo
from memplan.planners.base import plan
from memplan.testing.synthetic import MIB, chain_trace

PROFILE = "gtx1080ti"
FEW_TRIALS = 7  # the four pure scores plus a few sampled ones keep the test fast
GP_TRIALS = 11  # one past Optuna's 10 start-up trials, so the Gaussian process proposes the last


def _trace():
    return chain_trace(8, sizes=[s * MIB for s in (48, 40, 32, 24, 64, 16, 8, 56)], param_bytes=2 * MIB,
                       flops_per_layer=4e10)


def _stand_in_objective(plan_):
    """A deterministic objective unrelated to the scores: penalise early prefetches and odd storages."""
    return sum((d.back_before - d.trigger) + (d.storage % 3) for d in plan_.decisions) / 100.0


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(_autoswap_bo, "_objective_fn", lambda problem, objective: _stand_in_objective)


@pytest.mark.parametrize("share", [0.8, 0.6])
def test_bo_never_worse_than_pure_scores(stand_in, share):
    trace = _trace()
    cost = Cost.for_trace(trace, PROFILE)
    pure = [_stand_in_objective(plan(trace, f"{share * 100}%", planner=f"autoswap:{v}", cost=cost,
                                     simulate_result=False)) for v in ("doa", "aoa", "wdoa", "swdoa")]
    bo = plan(trace, f"{share * 100}%", planner="autoswap:bo", cost=cost, simulate_result=False, n_trials=FEW_TRIALS)
    assert _stand_in_objective(bo) <= min(pure)


def test_bo_same_seed_same_plan(stand_in):
    trace = _trace()
    runs = [plan(trace, "60%", planner="autoswap:bo", profile=PROFILE, seed=seed, simulate_result=False,
                 n_trials=GP_TRIALS).decisions for seed in (3, 3)]
    assert runs[0] == runs[1]


def test_bo_with_the_shared_simulator():
    simulate_mod = pytest.importorskip("memplan.sim.stage")
    trace = _trace()
    cost = Cost.for_trace(trace, PROFILE)
    budget = int(trace.peak_load_bytes * 0.6)

    def overhead(p):
        return simulate_mod.simulate(trace, p, cost=cost, budget=budget).overhead

    pure = min(overhead(plan(trace, budget, planner=f"autoswap:{v}", cost=cost, simulate_result=False))
               for v in ("doa", "aoa", "wdoa", "swdoa"))
    bo = plan(trace, budget, planner="autoswap:bo", cost=cost, simulate_result=False, n_trials=FEW_TRIALS)
    assert overhead(bo) <= pure + 1e-12


def test_search_runs_on_one_thread_and_restores_the_pools(monkeypatch):
    """Issue 11, defect 9: BLAS and torch threads only slowed the GP sampler's tiny problems."""
    torch = pytest.importorskip("torch")
    threadpoolctl = pytest.importorskip("threadpoolctl")
    seen = []

    def counting(plan_):
        seen.append((torch.get_num_threads(), {p["num_threads"] for p in threadpoolctl.threadpool_info()}))
        return _stand_in_objective(plan_)

    monkeypatch.setattr(_autoswap_bo, "_objective_fn", lambda problem, objective: counting)
    before = (torch.get_num_threads(), [p["num_threads"] for p in threadpoolctl.threadpool_info()])
    plan(_trace(), "60%", planner="autoswap:bo", profile=PROFILE, simulate_result=False, n_trials=FEW_TRIALS)
    assert seen and all(n == 1 and pools <= {1} for n, pools in seen)
    assert (torch.get_num_threads(), [p["num_threads"] for p in threadpoolctl.threadpool_info()]) == before


def test_a_time_limit_stops_the_search_after_the_pure_scores(stand_in, monkeypatch):
    """`time_limit_s` bounds the search (auto gives it a share of its own limit): past it, no
    sampled trial starts, but the four pure scores are still tried (one weighting each, and one
    more for the plan returned)."""
    import memplan.planners.autoswap as autoswap_module

    weightings = []
    combine = autoswap_module.combined_priority
    monkeypatch.setattr(autoswap_module, "combined_priority",
                        lambda problem, weights: weightings.append(weights) or combine(problem, weights))
    got = plan(_trace(), "60%", planner="autoswap:bo", profile=PROFILE, simulate_result=False, time_limit_s=1e-9)
    pure = [plan(_trace(), "60%", planner=f"autoswap:{v}", profile=PROFILE, simulate_result=False)
            for v in ("aoa", "doa", "wdoa", "swdoa")]
    assert len(weightings) == 4 + 1
    assert _stand_in_objective(got) == min(_stand_in_objective(p) for p in pure)


@pytest.mark.parametrize("limit", [0, -1.0])
def test_a_time_limit_must_be_positive(limit):
    with pytest.raises(MemplanError, match="time_limit_s must"):
        plan(_trace(), "60%", planner="autoswap:bo", profile=PROFILE, time_limit_s=limit)


def test_bo_reports_the_plans_it_scored():
    got = plan(_trace(), "60%", planner="autoswap:bo", profile=PROFILE, n_trials=FEW_TRIALS, simulate_result=False)
    assert 1 <= got.report["evaluations"] <= FEW_TRIALS  # distinct plans: trials may repeat one
    assert got.report["evaluations_per_s"] > 0
