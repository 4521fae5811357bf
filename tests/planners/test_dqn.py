"""The DQN planner of paper 002: graph features, environment transitions (Fig. 4), fitted Q-iteration,
weights files, and the planners' conformance."""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memplan.cli import main
from memplan.cost.model import Cost
from memplan.cost.profiles import get_profile
from memplan.errors import MemplanError, TraceFormatError
from memplan.planners.base import plan as make_plan
from memplan.planners.dqn import fresh_network
from memplan.planners.dqn.env import Env
from memplan.planners.dqn.graph import NOTHING_NODE, build_graph
from memplan.planners.dqn.net import load_weights, save_weights
from memplan.planners.dqn.train import (
    Instance,
    fit_step,
    run_episode,
    td_loss,
    transitions,
)
from memplan.sim.simulate import Simulator
from memplan.sim.validate import validate
from memplan.testing.conformance import PlannerConformance
from memplan.testing.synthetic import MIB, _Builder, chain_trace
from memplan.tracing.io import write_trace

SECOND = 1.0


def _profile(d2h_s_per_mib: float):
    """A device whose copies take exactly `d2h_s_per_mib` seconds per MiB, no latency."""
    rate = MIB / d2h_s_per_mib
    return replace(get_profile("h100"), d2h_bytes_per_s=rate, h2d_bytes_per_s=rate, copy_latency_s=0.0,
                   link_efficiency=1.0)


def _cost(trace, d2h_s_per_mib: float = 0.375) -> Cost:
    """Every op takes one second; offloading 4 MiB takes 1.5 s (paper 002 Fig. 4)."""
    return Cost(profile=_profile(d2h_s_per_mib), durations=np.full(len(trace.ops), SECOND))


# --- graph and features (§4.2-4.4) ------------------------------------------------------------------


def _five_ops():
    """x -> a (4 MiB) -> b (8 MiB) -> loss; backward reads b, then a."""
    b = _Builder()
    x = b.storage("x", 1 * MIB, "input", pre=True)
    a = b.storage("a", 4 * MIB, "activation")
    bb = b.storage("b", 8 * MIB, "activation")
    loss = b.storage("loss", 1 * MIB, "temp")
    gb = b.storage("gb", 2 * MIB, "temp")
    ga = b.storage("ga", 3 * MIB, "temp")
    b.op("f0", "forward", "l0", reads=[x], writes=[a], flops=1)
    b.op("f1", "forward", "l1", reads=[a], writes=[bb], flops=1)
    b.op("f2", "forward", "l2", reads=[bb], writes=[loss], flops=1)
    b.op("b3", "backward", "l2", reads=[loss, bb], writes=[gb], flops=1)
    b.op("b4", "backward", "l1", reads=[gb, a, x], writes=[ga], flops=1)
    return b.build(meta={"model": "five"})


def test_features_of_a_hand_made_five_op_graph():
    trace = _five_ops()
    deficit = 8 * MIB
    graph = build_graph(trace, _cost(trace), trace.peak_load_bytes - deficit, min_bytes=0)
    # One candidate: a (b's gap from op 2 to op 3 is empty). Offload at a's last forward access (op 1),
    # remove at its producer (op 0, which stands for "nothing") -> the next free node, op 2.
    assert [g.storage for g in graph.gaps] == [1]
    assert (graph.offload_node[0], graph.remove_node[0]) == (1, 2)
    logt = lambda s: math.log1p(s / 1.0) / 8
    swap_a, _swap_b, swap_gb, swap_ga = (logt(mib * 0.375) for mib in (4, 8, 2, 3))
    expected = np.array([
        # size/deficit, swap, recompute (its writers), revisit (next access after the node), type, valid
        [4 / 8, swap_a, logt(1), logt(1), 0.0, 0],   # op 0: writes a, next read at op 1
        [4 / 8, swap_a, logt(1), logt(3), 0.5, 0],   # offload a: last read at op 1, back at op 4
        [4 / 8, swap_a, logt(1), logt(3), 1.0, 0],   # remove a: the same gap
        [2 / 8, swap_gb, logt(1), logt(1), 0.0, 0],  # op 3: writes gb, read at op 4
        [3 / 8, swap_ga, logt(1), 0.0, 0.0, 0],      # op 4: writes ga, never read again
    ], dtype=np.float32)
    np.testing.assert_allclose(graph.features, expected, rtol=1e-6)
    pairs = {tuple(e) for e in graph.edges.tolist()}
    assert {(0, 1), (1, 0), (1, 4), (4, 1), (0, 4), (2, 3), (3, 3)} <= pairs  # consecutive, shared a and x, self
    assert (0, 2) not in pairs
    lag = dict(zip(map(tuple, graph.edges.tolist()), graph.edge_weight))
    assert lag[(1, 4)] == pytest.approx(logt(3)) and lag[(3, 3)] == 0
    # At node 2 with 2 MiB still to save: sizes over 2 MiB (clipped at 4), a's revisit from node 2.
    valid = np.array([1, 1, 0, 0, 0], dtype=bool)
    now = graph.state_features(2, valid, 2 * MIB)
    np.testing.assert_allclose(now[:, 0], [2, 2, 2, 1, 1.5])
    np.testing.assert_allclose(now[1:3, 3], [logt(2), logt(2)], rtol=1e-6)
    np.testing.assert_allclose(now[[0, 3, 4], 3], expected[[0, 3, 4], 3])
    np.testing.assert_array_equal(now[:, 5], valid)


# --- the environment (§4.5-4.8, Fig. 4) --------------------------------------------------------------


def _fig4(y_mib: int):
    """Ops of one second each; X0 (4 MiB) is last read in forward at op 3 and again at op 8; Z at op 7.

    With a 9 MiB limit, the load reaches the limit at op 3; Y (made at op 4) decides whether
    op 4 must wait for X0's copy: 1 MiB fits, 2 MiB does not (the memory-full case).
    """
    b = _Builder()
    x = b.storage("x", 1 * MIB, "input", pre=True)
    x0 = b.storage("X0", 4 * MIB, "activation")
    z = b.storage("Z", 2 * MIB, "activation")
    t2, t3 = b.storage("t2", MIB, "temp"), b.storage("t3", MIB, "temp")
    y = b.storage("Y", y_mib * MIB, "activation")
    loss, gy = b.storage("L", MIB, "temp"), b.storage("gY", 5 * MIB, "temp")
    gz, gx = b.storage("gZ", MIB, "temp"), b.storage("gX", MIB, "temp")
    b.op("f0", "forward", "m0", reads=[x], writes=[x0], flops=1)
    b.op("f1", "forward", "m1", reads=[x0], writes=[z], flops=1)
    b.op("f2", "forward", "m2", reads=[z], writes=[t2], flops=1)
    b.op("f3", "forward", "m3", reads=[x0, t2], writes=[t3], flops=1)
    b.op("f4", "forward", "m4", reads=[t3], writes=[y], flops=1)
    b.op("f5", "forward", "m5", reads=[y], writes=[loss], flops=1)
    b.op("b6", "backward", "m5", reads=[loss, y], writes=[gy], flops=1)
    b.op("b7", "backward", "m1", reads=[gy, z], writes=[gz], flops=1)
    b.op("b8", "backward", "m0", reads=[gz, x0, x], writes=[gx], flops=1)
    return b.build(meta={"model": "fig4"})


def _env_at_node_3(y_mib: int):
    trace = _fig4(y_mib)
    graph = build_graph(trace, _cost(trace), 9 * MIB, min_bytes=0)
    env = Env(graph)
    while env.c < 3:
        env.step(NOTHING_NODE if env.valid_mask()[NOTHING_NODE] else int(np.flatnonzero(env.valid_mask())[0]))
    assert env.c == 3 and not env.done
    k = [g.storage for g in graph.gaps].index(1)  # X0
    return env, graph, k


@pytest.mark.parametrize("action", ["nothing", "remove"])
def test_doing_nothing_or_removing_advances_one_node(action):
    env, graph, k = _env_at_node_3(y_mib=1)
    env.step(NOTHING_NODE if action == "nothing" else int(graph.remove_node[k]))
    assert env.c == 4


def test_an_offload_advances_by_its_copy_time_rounded_up_to_the_next_node():
    env, graph, k = _env_at_node_3(y_mib=1)
    assert env.valid_mask()[NOTHING_NODE]
    env.step(int(graph.offload_node[k]))
    # started at 3 s, the copy takes 1.5 s: op 4 starts at 4 s (before 4.5 s), the agent is at op 5
    assert env.c == 5
    assert (env.op_start[4], env.op_start[5]) == (4.0, 5.0)


def test_an_offload_with_memory_full_lands_on_the_next_node_after_the_wait():
    env, graph, k = _env_at_node_3(y_mib=2)
    assert not env.valid_mask()[NOTHING_NODE]  # op 4 cannot run unless something leaves
    env.step(int(graph.offload_node[k]))
    # Op 4 waits for X0's copy. The paper's copy overlaps the read at node 3 and waits 0.5 s; the
    # simulator starts a swap-out after the op that last touches it (4 s + 1.5 s), so it waits 1.5 s.
    assert env.c == 4
    assert env.op_start[4] == 5.5


def test_episode_rewards_are_the_simulated_overhead_split_over_actions():
    env, graph, k = _env_at_node_3(y_mib=2)
    env.step(int(graph.offload_node[k]))
    while not env.done:
        env.step(int(np.flatnonzero(env.valid_mask())[-1]))
    outcome = env.outcome()
    assert outcome.feasible and validate(graph.trace, outcome.plan, graph.budget_bytes) == []
    sim = Simulator(graph.trace, graph.cost).run(outcome.plan, graph.budget_bytes, timeline=True)
    assert outcome.overhead == pytest.approx(sim.overhead)
    assert outcome.rewards.sum() == pytest.approx(-sim.overhead)
    offload_step = env.transitions.index(k)
    assert outcome.rewards[offload_step] <= -1.5 / sim.baseline_time_s + 1e-9  # at least the forward wait
    # Same forward timing until the first decision the plan records earlier than the agent took it
    # (after the activation's last forward access, where the executor can act): from there the plan
    # frees memory sooner than the environment's clock assumed.
    ledger = env.ledger
    moved = [d.out_after for d in outcome.plan.decisions
             if d.out_after != ledger.out_after[ledger.gap_of[d.storage]]]
    upto = min([*moved, env.c]) + 1
    np.testing.assert_allclose(env.op_start[:upto], sim.op_start_s[:upto])


def test_greedy_episodes_on_a_chain_give_valid_plans_within_the_budget():
    trace = chain_trace(8)
    cost = Cost.for_trace(trace, "h100")
    for share in (0.8, 0.6, 0.5):  # the floor is 46.7%
        graph = build_graph(trace, cost, int(share * trace.peak_load_bytes), min_bytes=0)
        outcome, _ = run_episode(fresh_network(0), Instance.of(graph), 0.0, np.random.default_rng(0))
        assert outcome.feasible, outcome.reason
        assert validate(trace, outcome.plan, graph.budget_bytes) == []
        assert Simulator(trace, cost).run(outcome.plan, graph.budget_bytes).peak_load_bytes <= graph.budget_bytes


# --- fitted Q-iteration (§4.10) ---------------------------------------------------------------------


def test_fitted_q_updates_decrease_the_td_error_on_a_fixed_replay_buffer():
    trace = chain_trace(6)
    graph = build_graph(trace, Cost.for_trace(trace, "h100"), int(0.6 * trace.peak_load_bytes), min_bytes=0)
    inst = Instance.of(graph)
    net, rng = fresh_network(1), np.random.default_rng(0)
    replay = []
    for _ in range(6):
        outcome, steps = run_episode(net, inst, 1.0, rng)
        replay += transitions(0, steps, outcome)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    before = float(td_loss(net, replay, [inst], 0.9).detach())
    for _ in range(40):
        fit_step(net, optimizer, replay, [inst], 0.9)
    assert float(td_loss(net, replay, [inst], 0.9).detach()) < 0.5 * before


def test_training_stops_inside_an_episode_once_its_time_limit_passes(monkeypatch):
    # A clock that ticks one second per reading: the limit (2.5 s) passes at the second step of
    # the first episode, which is dropped (an episode on a large graph must not overrun the limit).
    train_module = importlib.import_module("memplan.planners.dqn.train")  # the package re-exports `train`
    ticks = iter(range(10_000))
    monkeypatch.setattr(train_module.time, "perf_counter", lambda: float(next(ticks)))
    trace = chain_trace(6)
    graph = build_graph(trace, Cost.for_trace(trace, "h100"), int(0.6 * trace.peak_load_bytes), min_bytes=0)
    config = train_module.TrainConfig(episodes=50, time_limit_s=2.5, seed=0)
    report = train_module.train(fresh_network(0), [Instance.of(graph)], config, progress=False)
    assert report.episodes == 0 and report.steps == 1


# --- weights files ----------------------------------------------------------------------------------


def test_weights_round_trip_through_json(tmp_path):
    net = fresh_network(3)
    save_weights(net, tmp_path / "w.json", meta={"note": "test"})
    again, meta = load_weights(tmp_path / "w.json")
    assert meta == {"note": "test"}
    for (name, a), b in zip(net.state_dict().items(), again.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("breakage", ["not json", "other schema", "wrong shape", "nan", "missing tensor"])
def test_a_corrupt_or_mismatched_weights_file_is_refused(tmp_path, breakage):
    path = tmp_path / "w.json"
    save_weights(fresh_network(0), path)
    data = json.loads(path.read_text())
    if breakage == "other schema":
        data["schema"] = "memplan.plan"
    elif breakage == "wrong shape":
        data["tensors"]["w2"]["shape"] = [3, 3]
    elif breakage == "nan":
        data["tensors"]["w7"]["data"][0] = float("nan")
    elif breakage == "missing tensor":
        del data["tensors"]["w8"]
    path.write_text("{not json" if breakage == "not json" else json.dumps(data))
    with pytest.raises(TraceFormatError, match=str(path)):
        load_weights(path)


@pytest.mark.parametrize("content", [None, "{", ('{"schema": "memplan.dqn-weights", "version": 1, "features": 6, '
                                                 '"dim": 4, "rounds": 4, "tensors": {}}')])
def test_the_cli_says_one_line_and_exits_2_for_bad_weights(tmp_path, capsys, content):
    trace_path, weights = tmp_path / "t.jsonl", tmp_path / "w.json"
    write_trace(chain_trace(6), trace_path)
    if content is not None:
        weights.write_text(content)
    code = main(["plan", str(trace_path), "--planner", "dqn:pretrained", "--budget", "70%",
                 "--param", f"weights={weights}", "-o", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and str(weights) in err
    assert not (tmp_path / "p.json").exists()


def test_dqn_train_writes_weights_that_plan(tmp_path, capsys):
    trace_path, weights = tmp_path / "t.jsonl", tmp_path / "w.json"
    write_trace(chain_trace(6), trace_path)
    assert main(["dqn", "train", str(trace_path), "--budgets", "80%,60%", "--episodes", "3", "--min-bytes", "0",
                 "-o", str(weights), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 3 and len(summary["problems"]) == 2
    _, meta = load_weights(weights)
    assert meta["episodes"] == 3
    plan = make_plan(chain_trace(6), "70%", planner="dqn:pretrained", weights=str(weights), min_bytes=0)
    assert validate(chain_trace(6), plan) == []


def test_a_pretrained_planner_without_weights_says_how_to_get_them(tmp_path):
    with pytest.raises(MemplanError, match="cannot read dqn weights"):
        make_plan(chain_trace(6), "60%", planner="dqn:pretrained", weights=str(tmp_path / "none.json"))


# --- conformance ------------------------------------------------------------------------------------


class TestDqnConformance(PlannerConformance):
    planner = "dqn"
    params = {"episodes": 3, "min_bytes": 0}
    budgets = ["100%", "70%", "50%", "40%"]


class TestDqnPretrainedConformance(PlannerConformance):
    planner = "dqn:pretrained"
    params = {"min_bytes": 0}
    budgets = ["100%", "70%", "50%", "40%"]


# --- weights files, fuzzed ----------------------------------------------------------------------------

_JSON_LEAF = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True) | st.text(max_size=8)
_JSON = st.recursive(_JSON_LEAF, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6),
                                                                                            inner, max_size=4),
                     max_leaves=12)


def _valid_weights() -> dict:
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        save_weights(fresh_network(0), Path(tmp) / "w.json")
        return json.loads((Path(tmp) / "w.json").read_text())


_VALID = _valid_weights()


def _paths(data, prefix=()):
    """Every path to a value inside a JSON document."""
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(data, list) and data:
        yield from _paths(data[0], prefix + (0,))
        yield from _paths(data[-1], prefix + (len(data) - 1,))


def _replaced(data, path, value):
    if not path:
        return value
    copy = list(data) if isinstance(data, list) else dict(data)
    copy[path[0]] = _replaced(data[path[0]], path[1:], value)
    return copy


_PATHS = list(_paths(_VALID))


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(_PATHS), value=_JSON, cut=st.none() | st.integers(0, 4000))
def test_a_damaged_weights_file_loads_or_is_refused_naming_the_file(tmp_path_factory, path, value, cut):
    text = json.dumps(_replaced(_VALID, path, value))
    if cut is not None:
        text = text[:cut]
    target = tmp_path_factory.mktemp("w") / "w.json"
    target.write_text(text)
    try:
        net, _ = load_weights(target)
    except MemplanError as exc:
        assert str(target) in str(exc) and "\n" not in str(exc)
        return
    assert all(bool(torch.isfinite(p).all()) for p in net.parameters())


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200) | _JSON.map(lambda v: json.dumps(v).encode()))
def test_the_cli_refuses_any_damaged_weights_in_one_line(tmp_path_factory, capsys, data):
    tmp = tmp_path_factory.mktemp("cli")
    trace_path, weights = tmp / "t.jsonl", tmp / "w.json"
    write_trace(chain_trace(6), trace_path)
    weights.write_bytes(data)
    capsys.readouterr()
    code = main(["plan", str(trace_path), "--planner", "dqn:pretrained", "--budget", "70%",
                 "--param", f"weights={weights}", "--param", "min_bytes=0", "-o", str(tmp / "p.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert not (tmp / "p.json").exists()


# --- executed for real --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_dqn_plan_trains_vgg11_exactly_within_its_budget_on_cpu():
    from tests.exec.test_interpreted import _kept_budget, _plain, _planned, _same_state
    from tests.exec.helpers import workload

    from memplan.errors import InfeasibleBudgetError
    from memplan.workflows.optimize import trace_step

    def make():
        return workload("vgg11-cifar", 8)

    w = make()
    trace = trace_step(w.step, w.inputs, w.model, w.optimizer)
    try:  # as low as the planner goes: every decision it can take is exercised
        plan = make_plan(trace, 1, planner="dqn:pretrained")
    except InfeasibleBudgetError as exc:
        plan = make_plan(trace, exc.min_feasible_bytes, planner="dqn:pretrained")
    assert plan.decisions and validate(trace, plan) == []
    got, stats = _planned(make, plan=plan, trace=trace)
    _same_state(got, _plain(make))
    _kept_budget(stats)
    assert stats["released"] + stats["recomputed"] > 0
