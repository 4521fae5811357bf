"""The `milp` planner: on tiny traces its plan is the best of every keep / swap / recompute
policy with every prefetch trigger (judged by the simulator, checked by the validator), it
passes the conformance suite, its report reaches `memplan plan --json`, and bad parameters
get one error line."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

from memplan.cli import main
from memplan.cost.model import Cost
from memplan.errors import InfeasibleBudgetError
from memplan.model import Decision, Op, Plan, Storage, Trace
from memplan.model.program import INTERPRETED
from memplan.planners.base import plan as make_plan
from memplan.planners.bound import fewest_away, lower_bound
from memplan.planners.milp import solve_milp
from memplan.problem import Problem
from memplan.sim.arrays import host_per_op
from memplan.sim.simulate import Simulator
from memplan.sim.validate import validate
from memplan.testing.conformance import PlannerConformance
from memplan.testing.synthetic import MIB, chain_trace, residual_trace
from memplan.tracing.io import write_trace
from tests.planners.test_bound import host_bound

EXACT = {"window": 0, "mip_rel_gap": 0.0}  # the whole gap, proven optimal
SMALL_WEIGHTS = 2**19  # below milp's min_bytes (1 MiB): weights and gradients stay, keeping brute force small


def _uneven_chain():
    return chain_trace(5, sizes=[(16 + 24 * (i % 4)) * MIB for i in range(5)])


def _light_residual():
    return residual_trace(3, flops_per_block=3e10)  # cheap blocks: recomputation competes with swapping


def _optimizer_state_chain() -> Trace:
    """Two layers and an optimizer whose state (48 MiB) is read only by its step: it can leave
    across the iteration boundary, its prefetch issued in forward or backward, or in the tail
    right after its own swap-out."""
    return _state_chain(48, late=False)


def _late_state_chain() -> Trace:
    """The same, but the state (96 MiB) is last read before the step's last op (a short op on the
    gradient): leaving after that op instead, its copy runs in the next step's long first op rather
    than at the step's end, where the step would wait for it."""
    return _state_chain(96, late=True)


def _state_chain(state_mib: int, late: bool) -> Trace:
    n = 7 if late else 6
    specs = [("x", 16, "input", 0, 3, False), ("w", 1, "param", 0, n, True), ("a0", 32, "activation", 0, 4, False),
             ("a1", 32, "activation", 1, 3, False), ("g", 32, "temp", 2, 4, False), ("g0", 16, "temp", 3, 4, False),
             ("dw", 1, "grad", 3, n, False), ("m", state_mib, "optimizer_state", 0, n, True)]
    storages = tuple(Storage(id=i, nbytes=size * MIB, kind=kind, alloc_op=lo, free_op=hi, persistent=keep)
                     for i, (_, size, kind, lo, hi, keep) in enumerate(specs))
    rows = [("aten.linear", "forward", (0, 1), (2,), 1e11), ("aten.linear", "forward", (2, 1), (3,), 1e11),
            ("aten.mse_loss_backward", "backward", (3,), (4,), 0.0), ("aten.linear_backward", "backward", (4, 2, 1),
                                                                      (5, 6), 2e11),
            ("aten.mul", "backward", (5,), (5,), 1e10), ("aten.adam_step", "optimizer", (1, 6, 7), (1, 7), 1e9)]
    rows += [("aten.zero_", "optimizer", (6,), (6,), 1e6)] if late else []
    ops = tuple(Op(index=i, name=name, phase=phase, module=f"layer{i}", reads=reads, writes=writes, flops=flops)
                for i, (name, phase, reads, writes, flops) in enumerate(rows))
    return Trace(storages=storages, ops=ops)


def _gaps(trace, sid):
    """Gaps between consecutive accesses with an op between, and a persistent storage's gap
    across the iteration boundary (written here, apart from the planner's code)."""
    acc, n = trace.accesses[sid], len(trace.ops)
    out = [(a, b) for a, b in zip(acc, acc[1:]) if b - a >= 2]
    if trace.storages[sid].persistent and acc and (n - 1 - acc[-1]) + acc[0] >= 1:
        out.append((acc[-1], acc[0]))
    return out


def _spans(a, b, op):
    return a < op < b if b > a else op > a or op < b


def _options(trace, budget, min_bytes=MIB, overlap=False):
    """Per gap of a storage of at least `min_bytes` that spans an op over the budget (leaving
    elsewhere only costs): keep (None), recompute (where the trace can rebuild it, not across the
    boundary), or swap with every prefetch op, back by the gap's end or earlier at any op
    where another gap ends (where a recomputation may read it); across the boundary with every
    prefetch op in the tail or the head, and also leaving after the step's last op (its copy carried
    over into the next step) with every prefetch op in the head; with `overlap`, every swap also
    with its copy out beside the op it leaves after (where that op does not write it)."""
    n = len(trace.ops)
    over = [i for i in range(n) if trace.load[i] > budget]
    gaps = [(s.id, a, b) for s in trace.storages if s.nbytes >= min_bytes for a, b in _gaps(trace, s.id)]
    ends = {b for _, a, b in gaps if b > a}
    out = []
    for sid, a, b in gaps:
        if not any(_spans(a, b, op) for op in over):
            continue
        choices = [None]
        if b > a:
            if trace.recomputable(sid):
                choices.append(Decision(storage=sid, action="recompute", out_after=a, back_before=b))
            for back in sorted({b} | {p for p in ends if a + 1 < p < b}):
                choices += [Decision(storage=sid, action="swap", out_after=a, back_before=back, trigger=t)
                            for t in range(a + 1, back + 1)]
        else:
            choices += [Decision(storage=sid, action="swap", out_after=a, back_before=b, trigger=t)
                        for t in [*range(0, b + 1), *range(a + 1, n)]]
            if a < n - 1:
                choices += [Decision(storage=sid, action="swap", out_after=n - 1, back_before=b, trigger=t)
                            for t in range(0, b + 1)]
        if overlap and sid not in trace.ops[a].writes:
            choices += [replace(d, overlap=True) for d in choices if d is not None and d.action == "swap"]
        out.append(choices)
    return out


def _brute_force(trace, cost, budget, overlap=False) -> float | None:
    """The least simulated time of any valid plan within the budget (None: there is none)."""
    simulator, best = Simulator(trace, cost), None
    for combo in itertools.product(*_options(trace, budget, overlap=overlap)):
        plan = Plan(decisions=tuple(sorted((d for d in combo if d), key=lambda d: (d.back_before, d.storage))))
        result = simulator.run(plan, budget)
        better = result.feasible and result.peak_load_bytes <= budget and (best is None or result.time_s < best)
        if better and not validate(trace, plan, budget):
            best = result.time_s
    return best


@pytest.mark.parametrize("factory, share", [
    (lambda: chain_trace(3, param_bytes=SMALL_WEIGHTS), 0.7),
    (lambda: chain_trace(3, param_bytes=SMALL_WEIGHTS, flops_per_layer=3e10), 0.65),
    (lambda: chain_trace(2, act_bytes=16 * MIB, param_bytes=32 * MIB), 0.8),  # weights across the boundary
    (lambda: chain_trace(2, act_bytes=16 * MIB, param_bytes=32 * MIB), 0.9),
    (_optimizer_state_chain, 0.8), (_optimizer_state_chain, 0.6),  # the state leaves across the boundary
    (_late_state_chain, 0.75),  # ... after the step's last op, carried over (milp's variant of its gap)
    pytest.param(lambda: chain_trace(4, sizes=[(16 + 24 * (i % 4)) * MIB for i in range(4)],
                                     param_bytes=SMALL_WEIGHTS, flops_per_layer=3e10), 0.75,
                 marks=pytest.mark.slow),  # 16,524 plans simulated
])
def test_milp_equals_brute_force_over_all_policies(factory, share):
    trace = factory()
    cost = Cost.for_trace(trace, "h100")
    budget = int(share * trace.peak_load_bytes)
    best = _brute_force(trace, cost, budget)
    try:
        plan = make_plan(trace, budget, planner="milp", cost=cost, **EXACT)
    except InfeasibleBudgetError as exc:
        assert best is None, f"brute force found a plan of {best} s"
        assert exc.min_feasible_bytes > budget
        return
    assert best is not None
    assert Simulator(trace, cost).run(plan, budget).time_s == pytest.approx(best, rel=1e-9)
    report = plan.report
    assert report["status"] == "optimal" and report["mip_gap"] == pytest.approx(0.0, abs=1e-9)
    # Every op here starts a layer: the MILP's objective is the simulated overhead, a swap-out carried
    # over to the next step (its bytes held there while it copies) included
    assert report["milp_overhead"] == pytest.approx(report["simulated_overhead"], abs=1e-9)


def test_milp_leaves_a_late_state_after_the_last_op_when_its_copy_then_costs_nothing():
    """The late state's copy out carried over into the next step's first op: no wait at the step's end
    (the swap after its last read waits for its 2 ms copy there)."""
    trace = _late_state_chain()
    cost = Cost.for_trace(trace, "h100")
    budget = int(0.75 * trace.peak_load_bytes)
    plan = make_plan(trace, budget, planner="milp", cost=cost, **EXACT)
    (state,) = [d for d in plan.decisions if d.storage == 7]
    assert state.out_after == len(trace.ops) - 1 and state.back_before == 5
    # the state's only: the weight's gap across the boundary spans no op over the budget
    assert plan.report["carried_variants"] == 1
    simulator = Simulator(trace, cost)
    carried, waited = simulator.run(plan, budget), simulator.run(Plan(decisions=(replace(state, out_after=5),)), budget)
    assert carried.breakdown["sync_stall_s"] == 0 and waited.breakdown["sync_stall_s"] > 1e-3
    assert carried.time_s < waited.time_s


BRUTE_CASES = [  # (trace, budget share, the bound equals the optimum there)
    (lambda: chain_trace(3, param_bytes=SMALL_WEIGHTS), 0.7, True),
    # the LP recomputes a storage while it swaps that storage's input, which no valid plan may do
    (lambda: chain_trace(3, param_bytes=SMALL_WEIGHTS, flops_per_layer=3e10), 0.65, False),
    (lambda: chain_trace(2, act_bytes=16 * MIB, param_bytes=32 * MIB), 0.8, True),
    (lambda: chain_trace(2, act_bytes=16 * MIB, param_bytes=32 * MIB), 0.9, True),
    (_optimizer_state_chain, 0.8, True),
    # the state's copy out, carried over from the previous step's end, starts in the LP's rows as early as
    # its last access (the optimizer's op) starts: 0.2354 against 0.2382
    (_optimizer_state_chain, 0.6, False),
]


@pytest.mark.parametrize("factory, share, tight", BRUTE_CASES)
def test_the_bound_is_never_above_the_brute_force_optimum(factory, share, tight):
    """The lower bound of every plan (`memplan.planners.bound`) against the best of every policy,
    swaps with their copy out beside their last op included (outside milp's model); on these tiny
    traces it is the optimum itself but on one (the LP does not know that a replay needs its inputs
    resident). milp reports it, below its own plan."""
    trace = factory()
    cost = Cost.for_trace(trace, "h100")
    budget = int(share * trace.peak_load_bytes)
    best = _brute_force(trace, cost, budget, overlap=True)
    bound = lower_bound(trace, budget, cost)
    assert best is not None and bound.overhead is not None
    baseline = float(sum(cost.durations))
    assert bound.overhead <= best / baseline - 1 + 1e-9
    assert (bound.overhead == pytest.approx(best / baseline - 1, abs=1e-5)) == tight
    report = make_plan(trace, budget, planner="milp", cost=cost, **EXACT).report
    assert report["bound"] == pytest.approx(bound.overhead) and report["bound"] <= report["simulated_overhead"] + 1e-9


@pytest.mark.parametrize("action_s", [30e-6, 2e-3])
@pytest.mark.parametrize("factory, share, tight", BRUTE_CASES)
def test_where_the_host_is_priced_the_bound_is_never_above_the_brute_force_optimum(factory, share, tight, action_s):
    """The same on a host-bound step (the host issues each op in 1.5 times the device's mean op
    time; actions cheap, or dear enough that the host's rows of the LP decide the bound): never
    above the optimum, never below what the device and the host's work bound apart."""
    trace = factory()
    plain = Cost.for_trace(trace, "h100")
    cost = host_bound(plain, action_s)
    budget = int(share * trace.peak_load_bytes)
    plain_s = Simulator(trace, cost).run(None).time_s
    best = _brute_force(trace, cost, budget, overlap=True)
    bound = lower_bound(trace, budget, cost).overhead
    assert best is not None and bound is not None
    assert bound <= best / plain_s - 1 + 1e-9
    device = (1 + lower_bound(trace, budget, plain).overhead) * float(sum(plain.durations))
    host = float(host_per_op(trace, cost)[INTERPRETED].sum()) + 2 * action_s * fewest_away(trace, budget,
                                                                                           [trace.peak_op])
    assert bound >= max(device, host) / plain_s - 1 - 1e-6


def test_the_light_residual_case_mixes_swaps_and_recomputes():
    trace = _light_residual()
    plan = make_plan(trace, "70%", planner="milp", **EXACT)
    assert {d.action for d in plan.decisions} == {"swap", "recompute"}


class TestMilp(PlannerConformance):
    planner = "milp"
    params = {"time_limit_s": 30.0}
    traces = [lambda: chain_trace(6), lambda: chain_trace(9, sizes=[(16 + 24 * (i % 4)) * MIB for i in range(9)]),
              lambda: residual_trace(3)]


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture()
def trace_file(tmp_path):
    path = tmp_path / "residual3.jsonl"
    write_trace(_light_residual(), path)
    return path


def test_plan_json_reports_objective_bound_and_gap(capsys, trace_file, tmp_path):
    code, out, err = _run(capsys, "plan", trace_file, "--planner", "milp", "--budget", "70%",
                          "--param", "window=0", "-o", tmp_path / "p.json", "--json")
    assert code == 0, err
    summary = json.loads(out)
    report = summary["report"]
    assert report["status"] == "optimal"
    assert report["milp_bound"] <= report["milp_overhead"] + 1e-12
    assert report["simulated_overhead"] == pytest.approx(summary["predicted"]["overhead"])
    # The lower bound of every plan, and the plan's distance to it.
    assert 0 <= report["bound"] <= report["simulated_overhead"] + 1e-9
    assert report["gap"] == pytest.approx(report["simulated_overhead"] - report["bound"])


@pytest.mark.parametrize("param, message", [
    ("time_limit_s=-1", "must not be negative"), ("time_limit_s=0", "must be positive"),
    ("mip_rel_gap=1", "must be below 1"), ("window=wide", "must be int"), ("min_bytes=-5", "must not be negative"),
    ("particles=3", "has no parameter"),
])
def test_bad_parameters_are_one_error_line(capsys, trace_file, tmp_path, param, message):
    code, out, err = _run(capsys, "plan", trace_file, "--planner", "milp", "--budget", "70%", "--param", param,
                          "-o", tmp_path / "p.json")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("memplan: error:") and message in err
    assert not (tmp_path / "p.json").exists()


def test_time_limit_option_is_the_time_limit_parameter(capsys, trace_file, tmp_path):
    code, out, err = _run(capsys, "plan", trace_file, "--planner", "milp", "--budget", "70%", "--time-limit", "5",
                          "-o", tmp_path / "p.json", "--json")
    assert code == 0, err
    assert json.loads(out)["params"]["time_limit_s"] == 5.0


@pytest.mark.parametrize("argv, message", [
    (["--planner", "milp", "--time-limit", "5", "--param", "time_limit_s=3"], "disagree"),
    (["--planner", "milp", "--time-limit", "-1"], "--time-limit"),
    (["--planner", "sqrt-n", "--time-limit", "5"], "has no parameter"),
])
def test_bad_time_limits_are_one_error_line(capsys, trace_file, tmp_path, argv, message):
    code, out, err = _run(capsys, "plan", trace_file, "--budget", "70%", *argv, "-o", tmp_path / "p.json")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("memplan: error:") and message in err


def test_a_time_limit_still_gives_a_valid_plan_within_the_budget():
    """Stopped long before HiGHS can prove anything, milp returns its best plan (or every feature
    map swapped), valid and within the budget, and says it is not proven optimal."""
    trace = chain_trace(12, sizes=[(16 + 24 * (i % 4)) * MIB for i in range(12)])
    cost = Cost.for_trace(trace, "h100")
    budget = int(0.6 * trace.peak_load_bytes)
    plan = make_plan(trace, budget, planner="milp", cost=cost, time_limit_s=1e-3, window=0)
    assert validate(trace, plan, budget) == []
    result = Simulator(trace, cost).run(plan, budget)
    assert result.feasible and result.peak_load_bytes <= budget
    report = plan.report
    assert report["simulated_overhead"] == pytest.approx(result.overhead)
    if report["status"] != "optimal":  # the usual case: HiGHS has not closed the gap in a millisecond
        assert report["optimal_s"] is None
        assert report["mip_gap"] is None or report["mip_gap"] >= 0


def test_a_milp_plan_mixing_swaps_and_recomputes_trains_exactly_within_its_budget():
    """Executed for real on CPU: the same parameters as plain training, bit for bit, and the
    measured peak within the budget (test_exec's oracle: plain training from the same seed)."""
    from tests.exec.test_interpreted import _kept_budget, _plain, _planned, _same_state, tiny_workload, trace_step  # noqa: I001

    import dataclasses

    from memplan.cost.model import Cost

    w = tiny_workload()
    trace = trace_step(w.step, w.inputs, w.model, w.optimizer)
    # the device's time alone: with the host's work priced, this tiny step swaps only (a run costs the host more)
    cost = dataclasses.replace(Cost.for_trace(trace, "h100"), priced_host=False)
    plan = make_plan(trace, 0.6, planner="milp", cost=cost, min_bytes=1024, window=2, time_limit_s=600.0)
    assert plan.report["status"] == "optimal"
    assert {d.action for d in plan.decisions} == {"swap", "recompute"}
    got, stats = _planned(tiny_workload, plan=plan, trace=trace)
    _same_state(got, _plain(tiny_workload), tol=0.0)  # bit for bit
    _kept_budget(stats)


@pytest.mark.parametrize("share", [0.8, 0.6])
def test_the_decomposition_is_never_worse_than_its_start_and_bounds_its_objective(share):
    """Forced on a small trace (no group solved whole): a valid plan within the budget, at least as
    good in the simulator as the fast planners' best it started from, with the LP relaxation's
    bound below the model's objective; and the whole solve's optimum is within that bound too."""
    from memplan.planners.milp import START_PLANNERS

    trace = _light_residual()
    cost = Cost.for_trace(trace, "h100")
    budget = int(share * trace.peak_load_bytes)
    simulator = Simulator(trace, cost)
    starts = []
    for name in START_PLANNERS:
        try:
            starts.append(simulator.run(make_plan(trace, budget, planner=name, cost=cost), budget))
        except InfeasibleBudgetError:
            continue
    plan = make_plan(trace, budget, planner="milp", cost=cost, max_direct_groups=0, time_limit_s=120.0)
    result = simulator.run(plan, budget)
    assert validate(trace, plan, budget) == [] and result.feasible and result.peak_load_bytes <= budget
    fitting = [s.time_s for s in starts if s.feasible and s.peak_load_bytes <= budget]
    assert not fitting or result.time_s <= min(fitting) * (1 + 1e-9)
    report = plan.report
    assert report["status"] == "decomposed" and report["chosen"].startswith(
        ("decomposition", "start", "every unit swapped", "the best plan of the fast planners"))
    assert report["milp_bound"] <= report["milp_overhead"] + 1e-9
    whole = make_plan(trace, budget, planner="milp", cost=cost, time_limit_s=120.0).report
    if whole["status"] == "optimal":
        assert report["milp_bound"] <= whole["milp_overhead"] + 1e-9 <= report["milp_overhead"] + 2e-9


def test_below_its_models_floor_milp_returns_a_fast_planners_plan_that_fits():
    """The model's units leave out storages under min_bytes: below its floor another planner may fit."""
    trace = chain_trace(4, act_bytes=8 * MIB, param_bytes=SMALL_WEIGHTS)
    cost = Cost.for_trace(trace, "h100")
    budget = int(0.7 * trace.peak_load_bytes)
    tiny_units = {"min_bytes": 2**40, "time_limit_s": 5.0}  # no unit at all: the floor is the peak
    plan = make_plan(trace, budget, planner="milp", cost=cost, **tiny_units)
    assert plan.report["status"] == "below the model's floor" and plan.report["floor_bytes"] > budget
    assert validate(trace, plan, budget) == [] and Simulator(trace, cost).run(plan, budget).peak_load_bytes <= budget
    with pytest.raises(InfeasibleBudgetError):  # where nothing fits, the model's floor is the answer
        make_plan(trace, 1, planner="milp", cost=cost, **tiny_units)
    with pytest.raises(InfeasibleBudgetError):  # without the fallback (auto has those plans): the floor
        solve_milp(trace, budget, cost, fallback=False, **tiny_units)


def test_auto_runs_its_last_milp_without_the_fallback(monkeypatch):
    """The fallback's plans are made after milp's solves (up to 25 s past its limit): auto's last milp,
    started from the best plan so far with the time left, leaves them out, so that auto's limit holds."""
    import memplan.planners.auto as auto

    calls = []
    real = auto.solve_milp
    monkeypatch.setattr(auto, "solve_milp", lambda *args, **kwargs: calls.append(kwargs) or real(*args, **kwargs))
    monkeypatch.setattr(auto, "MILP_MAX_GROUPS", 0)  # no model small enough for step 3: the last milp runs
    trace = _light_residual()
    cost = Cost.for_trace(trace, "h100")
    make_plan(trace, int(0.7 * trace.peak_load_bytes), planner="auto", cost=cost, time_limit_s=30.0)
    last = [kwargs for kwargs in calls if kwargs.get("start")]
    assert last and all(kwargs["fallback"] is False for kwargs in last)


@pytest.mark.parametrize("moves", ["all", "activations"])
def test_the_whole_gaps_are_the_models_decision_groups(moves):
    """`auto` sizes milp's model by its whole gaps alone (making the model takes seconds on a large trace):
    every unit of the model is one of them or a variant in its group, on a trace whose model has variants."""
    from memplan.planners.milp.layers import layer_problem, whole_gaps

    trace = _uneven_chain()
    cost = Cost.for_trace(trace, "h100")
    budget = int(0.6 * trace.peak_load_bytes)
    problem = layer_problem(trace, cost, MIB, budget, moves)
    assert len(problem.units) > len(problem.groups()) > 0
    assert [(u.storage, u.out_after, u.back_before) for u in whole_gaps(trace, cost, MIB, budget, moves)] == \
        [(problem.units[k].storage, problem.units[k].out_after, problem.units[k].back_before) for k in problem.groups()]


@pytest.mark.parametrize("asynchronous", [True, False])
def test_the_model_prices_the_hosts_work_as_the_simulator_does(asynchronous):
    """On a host-bound step (the host issues each op in 1.5 mean op times): keeping everything costs
    the host's work over the device's; one swap costs four more actions and, as its storage is no
    tensor autograd saves here (no hook records), the interpreted executor's mode at every op; on the
    CPU (its own device) the host's work adds to the device's instead. Hand-written sums, and the
    simulator's own time for the plain step."""
    from memplan.planners.milp.host import host_price
    from memplan.planners.milp.layers import layer_problem
    from memplan.planners.milp.model import build

    trace = chain_trace(6)
    cost = host_bound(Cost.for_trace(trace, "h100"), action_s=2e-4)
    cost = replace(cost, profile=replace(cost.profile, mode_op_s=5e-6, kind="gpu" if asynchronous else "cpu"))
    problem = layer_problem(trace, cost, MIB)  # every unit, none needed under no cap
    host = host_price(problem, Simulator(trace, cost), cost)
    assert host is not None and host.interpreted.all()
    model = build(problem, trace.peak_load_bytes, 0, host=host)
    kept = {group: None for group in model.members}
    group = next(iter(model.members))
    swapped = {**kept, group: (group, "swap")}
    plain_ms, mode_ms = 1e3 * Simulator(trace, cost).run(None).time_s, 1e3 * 5e-6 * len(trace.ops)
    base_ms = 1e3 * problem.baseline_s
    objective = {name: float(model.solve(60.0, 0.0, fixed=fixed).fun) for name, fixed in (("kept", kept),
                                                                                          ("swapped", swapped))}
    if asynchronous:
        assert objective["kept"] == pytest.approx(plain_ms - base_ms, abs=1e-6)
        assert objective["swapped"] >= objective["kept"] + mode_ms + 4 * 1e3 * 2e-4 - 1e-6
    else:
        host_ms = plain_ms - base_ms  # the CPU: the plain step is the device's and the host's work together
        assert objective["kept"] == pytest.approx(host_ms, abs=1e-6)
        assert objective["swapped"] >= objective["kept"] + mode_ms + 4 * 1e3 * 2e-4 - 1e-6


def test_the_plans_milp_falls_back_on_are_polished_to_a_local_optimum_in_the_simulator():
    """The fast planners' plans are made for no executor in particular: milp's fallback is the best of them
    after the local search `auto` runs, so faster than every one of them raw on a traced ResNet, and a
    local optimum (polishing it again finds nothing)."""
    from memplan.planners.kit.candidates import DEFAULT_MIN_BYTES
    from memplan.planners.kit.fitting import fitting_plans
    from memplan.planners.kit.polish import Polisher
    from memplan.planners.milp.finish import POLISH_S, START_PLANNERS, fast_start
    from memplan.problem import Problem
    from memplan.workflows.workloads import trace_workload

    trace = trace_workload("resnet18-cifar", 8, fake=True)
    cost = Cost.for_trace(trace, "h100")
    simulator, budget = Simulator(trace, cost), int(0.6 * trace.peak_load_bytes)
    raw = fitting_plans(Problem(trace, cost, budget), START_PLANNERS, simulator)
    fallback = Plan(decisions=fast_start(trace, budget, cost, simulator, polish_s=POLISH_S))
    time_s = simulator.time_if_fits(fallback, budget)
    assert raw and time_s < min(simulator.run(p, budget).time_s for p in raw)
    polisher = Polisher.of(trace, cost, budget, simulator, DEFAULT_MIN_BYTES)
    assert simulator.time_if_fits(polisher.polish(fallback, float("inf")), budget) == pytest.approx(time_s)
