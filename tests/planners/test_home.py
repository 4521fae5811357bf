"""HOME (paper 004 §3): the PSO update rule, the swarm, policies that always validate, the CLI."""

import json

import numpy as np
import pytest

from memplan.cli import main
from memplan.errors import MemplanError
from memplan.model import Action, Plan
from memplan.planners.base import plan as make_plan
from memplan.planners.home import pso
from memplan.planners.home.workers import make_chunks
from memplan.planners.kit.featuremaps import Decoder, feature_maps
from memplan.sim.validate import validate
from memplan.testing.conformance import PlannerConformance
from memplan.testing.synthetic import chain_trace
from memplan.tracing.io import write_trace
from memplan.workflows.optimize import trace_step

from tests.exec.helpers import tiny_workload
from tests.user_errors import one_line_error

SMALL = {"particles": 6, "iters": 5}


class Recorder:
    """A hand-made evaluator: a table of overheads per policy, recording what was asked."""

    def __init__(self, table: dict, default: float = 9.0):
        self.table, self.default, self.asked = table, default, []

    def __call__(self, policy) -> float:
        key = tuple(int(a) for a in policy)
        self.asked.append(key)
        return self.table.get(key, self.default)


def test_update_rule_on_the_papers_figure_5_example():
    """Fig. 5: particle 1 in iteration 3 is [0, 1, 2, 0]; the last iteration's best (particle 2's
    policy) is [2, 2, 2, 0]; particle 1's historical best is [1, 1, 2, 0]. Tensor by tensor the
    action of P1 and of P2 are tried, each in the policy updated so far, and the lower overhead
    wins. (The paper's text lists [0, 1, 2, 0] as the second candidate for tensor 1, but its
    Algorithm 3 sets tensor 1 to P2[1] = 1: [1, 1, 2, 0]; the algorithm is what is implemented.)"""
    table = {(2, 1, 2, 0): 0.30, (1, 1, 2, 0): 0.20,  # tensor 1: P2's action (1) is cheaper
             (1, 2, 2, 0): 0.10}  # tensor 2, with tensor 1 already 1: P1's action (2) is cheaper
    score = Recorder(table)
    new = pso.update_particle(np.array([0, 1, 2, 0], np.int8), np.array([2, 2, 2, 0], np.int8),
                              np.array([1, 1, 2, 0], np.int8), score)
    assert new.tolist() == [1, 2, 2, 0]
    # Tensors 3 and 4 agree in P1 and P2: no evaluation, the shared action is kept.
    assert score.asked == [(2, 1, 2, 0), (1, 1, 2, 0), (1, 2, 2, 0), (1, 1, 2, 0)]


def test_update_rule_ties_go_to_the_historical_best():
    score = Recorder({})  # every policy costs the same
    new = pso.update_particle(np.array([0, 0], np.int8), np.array([1, 2], np.int8), np.array([2, 1], np.int8), score)
    assert new.tolist() == [2, 1]


def test_random_policies_draw_only_allowed_actions():
    allowed = np.array([[True, True, True], [True, True, False], [True, False, False]])
    drawn = pso.random_policies(allowed, 300, np.random.default_rng(0))
    assert set(drawn[:, 0]) == {0, 1, 2} and set(drawn[:, 1]) == {0, 1} and set(drawn[:, 2]) == {0}
    assert np.array_equal(drawn, pso.random_policies(allowed, 300, np.random.default_rng(0)))


def _plain_swarm(policies, score, iters):
    """Algorithms 1 and 3 as printed: no memo, no early stop (the oracle for `swarm`)."""
    x = policies.copy()
    pbest, pscore = x.copy(), np.full(len(x), np.inf)
    best, best_score, bests = None, np.inf, []
    for it in range(iters):
        scores = np.array([score(p) for p in x])
        for i, s in enumerate(scores):
            if s < best_score:
                best, best_score = x[i].copy(), s
            if s < pscore[i]:
                pbest[i], pscore[i] = x[i].copy(), s
        bests.append(best_score)
        p1 = x[int(np.argmin(scores))].copy()
        x = np.array([pso.update_particle(x[i], p1, pbest[i], score) for i in range(len(x))])
    return best, best_score, bests


@pytest.mark.parametrize("workers", [1, 2])
def test_swarm_equals_the_plain_algorithm(workers):
    rng = np.random.default_rng(3)
    weights = rng.random((12, 3))
    pair = rng.random((11, 3, 3))

    def score(p):  # not separable: neighbouring tensors interact
        return float(weights[np.arange(12), p].sum() + pair[np.arange(11), p[:-1], p[1:]].sum())

    policies = pso.random_policies(np.ones((12, 3), bool), 8, np.random.default_rng(1))
    chunks = make_chunks(score, policies, workers)
    try:
        best, best_score, history = pso.swarm(chunks, 15, feasible_below=1e3)
    finally:
        for c in chunks:
            c.close()
    want, want_score, want_bests = _plain_swarm(policies, score, 15)
    assert best.tolist() == want.tolist() and best_score == want_score
    assert history.best == want_bests
    assert history.converged_at is not None  # it reaches a fixed point well before 15 iterations


def test_deadline_stops_the_search():
    policies = pso.random_policies(np.ones((5, 3), bool), 4, np.random.default_rng(0))
    chunks = make_chunks(lambda p: float(p.sum()), policies, 1)
    _, _, history = pso.swarm(chunks, 100, 1e3, deadline=0.0)
    assert len(history.best) == 1


@pytest.fixture(scope="module")
def tiny():
    w = tiny_workload()
    return trace_step(w.step, w.inputs, w.model, w.optimizer)


def test_every_random_policy_gives_a_valid_plan(tiny):
    """The decoding rules (recompute inputs fetched back, unrebuildable recomputes kept) make any
    policy one the independent validator accepts, on a trace with in-place ReLUs and dropout."""
    fm = feature_maps(tiny, min_bytes=0)
    assert len(fm) > 5 and fm.recomputable.any()
    decode = Decoder(fm)
    policies = pso.random_policies(fm.allowed(), 200, np.random.default_rng(0))
    uniform = [np.full(len(fm), a, np.int8) for a in (Action.KEEP, Action.SWAP)] + [np.where(fm.recomputable, Action.RECOMPUTE, Action.SWAP)]
    for policy in list(policies) + uniform:
        plan = Plan(decisions=decode(policy))
        assert validate(tiny, plan) == [], policy
        assert plan.decisions == Decoder(fm)(policy)  # the memo changes nothing


def test_a_recomputation_fetches_its_swapped_input_back():
    trace = chain_trace(6)
    fm = feature_maps(trace, min_bytes=0)
    names = [trace.storages[int(s)].name for s in fm.storage]
    policy = np.full(len(fm), Action.KEEP, np.int8)
    policy[names.index("a2")], policy[names.index("a3")] = Action.SWAP, Action.RECOMPUTE
    by_name = {trace.storages[d.storage].name: d for d in Decoder(fm)(policy)}
    assert by_name["a2"].back_before == by_name["a3"].back_before  # back for a3's replay, not later
    assert validate(trace, Plan(decisions=tuple(by_name.values()))) == []


def test_home_plans_fit_and_record_their_convergence():
    trace = chain_trace(9)
    plan = make_plan(trace, "60%", planner="home", **SMALL)
    assert plan.predicted["feasible"] and plan.predicted["peak_load_bytes"] <= plan.budget_bytes
    series = plan.history["series"]
    assert len(series["best"]) == SMALL["iters"]
    assert all(a >= b for a, b in zip(series["best"], series["best"][1:]))  # best so far never worsens
    assert plan.history["feature_maps"] == 8  # a8 is read at once by the loss gradient: no gap


def test_home_does_not_depend_on_the_number_of_workers():
    trace = chain_trace(9, sizes=[(16 + 24 * (i % 4)) * 2**20 for i in range(9)])
    one = make_plan(trace, "70%", planner="home", workers=1, **SMALL)
    two = make_plan(trace, "70%", planner="home", workers=2, **SMALL)
    assert one.decisions and one.decisions == two.decisions


def test_home_at_the_peak_moves_nothing():
    assert make_plan(chain_trace(6), "100%", planner="home").decisions == ()


def test_home_refuses_no_particles():
    with pytest.raises(MemplanError, match="at least 1"):
        make_plan(chain_trace(6), "50%", planner="home", particles=0)


class TestHome(PlannerConformance):
    planner = "home"
    params = SMALL


class TestHomeFast(PlannerConformance):
    planner = "home:fast"
    params = {"particles": 6, "iters": 5, "time_limit_s": 30.0}


# --- the command line ------------------------------------------------------------------------------


@pytest.fixture()
def trace_file(tmp_path):
    path = tmp_path / "chain9.jsonl"
    write_trace(chain_trace(9), path)
    return path


@pytest.mark.parametrize("argv, says", [
    (["--planner", "home", "--param", "particles=0"], "at least 1"),
    (["--planner", "home:fast", "--param", "time_limit_s=-1"], "must not be negative"),
    (["--planner", "home:nope"], "unknown planner 'home:nope'"),
])
def test_bad_parameters_give_one_line_and_exit_2(capsys, trace_file, tmp_path, argv, says):
    line = one_line_error(capsys, ["plan", trace_file, "--budget", "60%", "-o", tmp_path / "p.json", *argv])
    assert says in line
    assert not (tmp_path / "p.json").exists()


def test_plan_plot_draws_the_convergence(capsys, trace_file, tmp_path):
    png = tmp_path / "conv.png"
    code = main(["plan", str(trace_file), "--planner", "home", "--budget", "60%", "--param", "particles=6",
                 "iters=5", "-o", str(tmp_path / "p.json"), "--plot", str(png), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["plot"] == str(png) and png.read_bytes()[:4] == b"\x89PNG"


def test_plot_of_a_planner_without_a_search_is_refused(capsys, trace_file, tmp_path):
    line = one_line_error(capsys, ["plan", trace_file, "--planner", "sqrt-n", "--budget", "100%", "-o",
                                   tmp_path / "p.json", "--plot", tmp_path / "c.png"])
    assert "no search history" in line and not (tmp_path / "p.json").exists()


def test_home_reports_every_plan_it_evaluated(monkeypatch):
    """`evaluations` counts what reached the simulator: each run, and each plan found not to fit
    without a run (counted here by wrapping the simulator's two doors)."""
    from memplan.sim.simulate import Simulator

    seen = []
    run, fits = Simulator.run, Simulator.time_if_fits

    def counted_run(self, *args, **kwargs):
        seen.append("run")
        return run(self, *args, **kwargs)

    def counted_fits(self, plan, budget):
        before = len(seen)
        out = fits(self, plan, budget)
        if len(seen) == before:
            seen.append("not simulated")
        return out

    monkeypatch.setattr(Simulator, "run", counted_run)
    monkeypatch.setattr(Simulator, "time_if_fits", counted_fits)
    plan = make_plan(chain_trace(9), "60%", planner="home", workers=1, simulate_result=False, **SMALL)
    assert plan.report["evaluations"] == len(seen) > SMALL["particles"]
    assert plan.report["evaluations_per_s"] > 0
