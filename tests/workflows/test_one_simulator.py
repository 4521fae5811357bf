"""One plan, one Simulator, on `memplan run`'s way to the executor (issue 50).

The planner, the check of its plan's hooked form (memplan.planners.base.hooks_fit), the plan's
prediction and the step program's compiler all simulate with the Problem's own simulator
(memplan.sim.simulate.simulator_of): a plan is prepared once, not once per room it passes. The
one other simulator on the way prices the step as a CUDA graph would replay it (another cost
model: memplan.sim.replayed), for the report's capture schedule.
"""

import json

import pytest

from memplan.cli import main
from memplan.sim import simulate as simulate_module


@pytest.fixture
def simulators(monkeypatch):
    """Every Simulator made from now on: (trace digest, cost model, hooks)."""
    made = []
    original = simulate_module.Simulator.__init__

    def counting(self, trace, cost, kernel=None, hooks=True):
        made.append((trace.digest, cost, hooks))
        original(self, trace, cost, kernel, hooks)

    monkeypatch.setattr(simulate_module.Simulator, "__init__", counting)
    return made


@pytest.mark.parametrize("planner", ["sqrt-n", "capuchin"])
def test_memplan_run_simulates_its_plan_with_one_simulator(simulators, planner, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["run", "resnet18-cifar", "--batch", "16", "--planner", planner, "--budget", "90%", "--steps", "1", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["predicted"]["feasible"] and out["executor"]["decisions"] > 0
    plan_costs = {id(cost) for _, cost, _ in simulators}
    assert len(simulators) == len(plan_costs) == 2, f"{len(simulators)} simulators: {simulators}"
    replay = out["cuda_graph"]["schedule"]["predicted_replay_s"]
    assert replay is not None  # the second simulator: the graph replay's estimate
    assert len({digest for digest, _, _ in simulators}) == 1
