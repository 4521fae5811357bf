"""`memplan.optimize(..., compile=...)`: the budget kept in measured bytes with two compilations at
most, training as plain torch.compile trains, swaps refused where the compiler cannot offload.

The library's own tests compile with `aot_eager` (AOTAutograd and the partitioner, no code
generation); one test runs Inductor, as a user does, through `memplan run --compile`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from torch import nn

from memplan import optimize
from memplan.cli import main
from memplan.errors import InfeasibleBudgetError, MemplanError
from memplan.model import Decision, Plan
from memplan.problem import Problem
from memplan.workflows.compiled import COMPILATIONS, compiled_problem, plan_compiled
from memplan.workflows.keep_budget import FitOnce
from memplan.workflows.measure import measure_steps
from memplan.workflows.step_trace import trace_step
from tests.exec.helpers import tiny_workload, train_step_of

pytestmark = pytest.mark.usefixtures("one_torch_thread")
AOT = {"backend": "aot_eager"}
STEPS = 4


def _trained(w, step, steps: int = STEPS) -> list[dict]:
    return measure_steps(step, lambda i: w.make_inputs(w.batch, seed=20 + i), steps, w.model, w.optimizer, 0,
                         compiled=True)


@dataclass
class _MLP:
    """Linear layers, ReLU and dropout at a batch whose activations outweigh the weights."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: Callable
    inputs: tuple = ()
    batch: int = 256

    @classmethod
    def build(cls, seed: int = 0) -> "_MLP":
        torch.manual_seed(seed)
        layers = [m for _ in range(4) for m in (nn.Linear(128, 128), nn.ReLU(), nn.Dropout(0.1))]
        model = nn.Sequential(*layers, nn.Linear(128, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        w = cls(model, optimizer, train_step_of(model, optimizer))
        w.inputs = w.make_inputs(w.batch, 99)
        return w

    def make_inputs(self, batch: int, seed: int) -> tuple:
        g = torch.Generator().manual_seed(seed)
        return torch.randn(batch, 128, generator=g), torch.randint(0, 10, (batch,), generator=g)


def test_a_compiled_step_keeps_its_budget_and_trains_as_plain_torch_compile():
    w = _MLP.build()
    step = optimize(w.step, *w.inputs, budget="75%", planner="auto", model=w.model, optimizer=w.optimizer,
                    compile=AOT, time_limit_s=2)
    records = _trained(w, step)
    stats = step.stats()
    step.close()
    assert "forward" not in w.model.__dict__  # the model's own forward is back
    settled = records[stats["final_plan_from_step"]:]
    assert settled and all(r["measured_peak_bytes"] <= step.keeper.budget_bytes * 1.02 for r in settled)
    assert 1 <= len(stats["compilations"]) <= COMPILATIONS
    assert all(c["decisions_lowered"] > 0 and c["tagged_but_saved"] == 0 for c in stats["compilations"])
    assert {d.action for d in step.plan.decisions} == {"recompute"}  # the CPU cannot offload
    plain = _MLP.build()
    plain.model.forward = torch.compile(plain.model.forward, **AOT)
    _trained(plain, plain.step)
    for a, b in zip(w.model.parameters(), plain.model.parameters()):
        assert torch.equal(a, b)  # the graphs differ only in what the backward recomputes


def test_a_saved_plan_is_lowered_as_it_is():
    w = _MLP.build()
    trace = trace_step(w.step, w.inputs, w.model, w.optimizer)
    plan = plan_compiled(compiled_problem(trace, "none", "h100"), "checkpoint-all", offload=False, params={})
    assert plan.decisions
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, compile=AOT, plan=plan, trace=trace)
    _trained(w, step, 2)
    assert step.keeper is None and step.plan is plan and len(step.stats()["compilations"]) == 1
    step.close()


def test_without_offload_a_plan_recomputes_only():
    w = tiny_workload()
    trace = trace_step(w.step, w.inputs, w.model, w.optimizer)
    problem = compiled_problem(trace, "80%", "h100")
    with pytest.raises(MemplanError, match="only swaps, and this compiled step cannot offload"):
        plan_compiled(problem, "save-on-cpu", offload=False, params={})
    plan = plan_compiled(problem, "auto", offload=False, params={"time_limit_s": 1})
    assert plan.decisions and {d.action for d in plan.decisions} == {"recompute"}
    assert not problem.trace.saved and not problem.trace.calls  # the compiler takes every decision at its op
    assert not problem.cost.priced_host


def test_compile_goes_with_neither_memplans_executor_nor_its_cuda_graphs():
    w = tiny_workload()
    for options in ({"executor": "interpreted"}, {"cuda_graph": "auto"}):
        with pytest.raises(MemplanError, match="compile runs the step through torch.compile"):
            optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, compile=True, **options)
    with pytest.raises(MemplanError, match="compile must be True, False or a dict"):
        optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, compile="yes")


# --- keeping the budget with one plan made again (memplan.workflows.keep_budget.FitOnce) ---------


def _keeper(plans: list):
    asked = []

    def make_plan(nbytes):
        asked.append(nbytes)
        if not plans:
            raise InfeasibleBudgetError("no", budget_bytes=nbytes, min_feasible_bytes=nbytes + 1)
        return plans.pop(0)

    return FitOnce(budget_bytes=1000, make_plan=make_plan), asked


def test_a_step_within_its_budget_that_holds_what_was_simulated_is_kept():
    keeper, asked = _keeper([Plan()])
    assert keeper.after_step(980, 950) is None and keeper.settled and not asked


def test_a_step_that_holds_less_than_simulated_is_planned_again_with_the_memory_it_left():
    again = Plan(decisions=(Decision(storage=0, action="recompute", out_after=0, back_before=1),))
    keeper, asked = _keeper([again])
    assert keeper.after_step(800, 1000) is again and asked == [1200] and keeper.filling and keeper.replanned == 1
    assert keeper.after_step(1010, 1180) is None and keeper.settled and keeper.reverted  # back to the first


def test_a_step_over_its_budget_is_planned_again_under_the_excess_and_not_a_third_time():
    keeper, asked = _keeper([Plan(), Plan()])
    assert keeper.after_step(1100, 1000) is not None and asked == [900]
    assert keeper.after_step(1050, 900) is None and keeper.settled and not keeper.reverted and asked == [900]


def test_a_margin_no_plan_meets_leaves_the_first_plan_and_says_why():
    keeper, _ = _keeper([])
    assert keeper.after_step(1100, 1000) is None and keeper.settled and "no" in keeper.error
    keeper, _ = _keeper([])
    assert keeper.after_step(700, 1000) is None and keeper.settled and keeper.error is None  # it fit already


# --- Inductor, as a user runs it -----------------------------------------------------------------


@pytest.mark.slow  # Inductor compiles a small GPT-2 twice (the run, and plain compiled training): about a minute
def test_memplan_run_compile_keeps_the_budget_and_matches_plain_compiled_training(capsys):
    assert main(["run", "hf:gpt2", "--config", "n_layer=2", "n_embd=32", "n_head=2", "vocab_size=128", "seq_len=32",
                 "--batch", "2", "--planner", "auto", "--budget", "95%", "--compile", "--steps", "3", "--check",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["within_budget"] and out["max_param_diff"] <= 1e-5  # against plain compiled training
    compilations = out["executor"]["compilations"]
    assert 1 <= len(compilations) <= COMPILATIONS and out["predicted"]["level"] == "compiled"
    assert [s["meter"] for s in out["steps"]] == ["allocator"] * 3


@pytest.mark.parametrize("argv, message", [
    (["--compile-mode", "reduce-overhead"], "give --compile too"),
    (["--compile", "--cuda-graph", "auto"], "goes with neither"),
])
def test_compile_options_that_do_not_go_together_are_one_clear_error(capsys, argv, message):
    assert main(["run", "vgg11-cifar", "--batch", "2", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_budget_below_the_traces_reach_is_planned_at_the_least_load_and_left_to_the_measured_step(monkeypatch):
    # a compiled step holds less than the trace says (it fuses, and recomputes on its own): the plan of
    # the least load the planner reaches may still keep a budget below it, which the keeper measures
    import memplan.workflows.compiled as compiled

    asked = []

    def planner(problem, name, offload, params):
        asked.append(problem.budget_bytes)
        if problem.budget_bytes < 1000:
            raise InfeasibleBudgetError("below", budget_bytes=problem.budget_bytes, min_feasible_bytes=1000)
        return Plan(budget_bytes=problem.budget_bytes)

    monkeypatch.setattr(compiled, "plan_compiled", planner)
    problem = Problem(trace=None, cost=None, budget_bytes=900)
    assert compiled._first_plan(problem, "auto", False, {}, measured=True).budget_bytes == 1000
    assert asked == [900, 1000]
    with pytest.raises(InfeasibleBudgetError):  # nothing measures it: the planner's refusal stands
        compiled._first_plan(problem, "auto", False, {}, measured=False)


def test_a_step_over_its_budget_that_no_plan_meets_with_the_margin_gets_the_least_load():
    least = Plan(decisions=(Decision(storage=0, action="recompute", out_after=0, back_before=1),))
    asked = []

    def make_plan(nbytes):
        asked.append(nbytes)
        if nbytes < 950:
            raise InfeasibleBudgetError("below", budget_bytes=nbytes, min_feasible_bytes=950)
        return least

    keeper = FitOnce(budget_bytes=1000, make_plan=make_plan)
    assert keeper.after_step(1200, 1000) is least and asked == [800, 950] and keeper.replanned == 1
