"""memplan.integrations.planned: the step kinds a framework's loop runs, one plan each (issue 40).

A framework's forward-and-backward step is stood in for by a plain function on a small MLP; the
oracle is the same steps run plainly from the same state.
"""

from __future__ import annotations

import copy

import pytest
import torch

from memplan.errors import MemplanError
from memplan.integrations.planned import PlannedSteps, kind_of


def _model():
    torch.manual_seed(0)
    hidden = [layer for _ in range(6) for layer in (torch.nn.Linear(128, 128), torch.nn.ReLU())]
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), *hidden, torch.nn.Linear(128, 4))


def _step(model):
    def forward_backward(x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()

    return forward_backward


def _batches(sizes):
    """Made one at a time: a batch kept alive beside the next one would be memory the plan does not have."""
    g = torch.Generator().manual_seed(1)
    return ((torch.randn(n, 64, generator=g), torch.randint(0, 4, (n,), generator=g)) for n in sizes)


def _train(model, batches, run, accumulate: int = 1):
    """SGD over `batches`, each forward and backward through `run`; returns the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for i, (x, y) in enumerate(batches):
        losses.append(run(_step(model), (x, y), model, opt))
        if (i + 1) % accumulate == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return losses


def test_each_kind_of_step_gets_its_plan_and_training_is_plain_training():
    plain_model, planned_model = _model(), _model()
    sizes = [512, 512, 256, 256, 512, 512]
    plain = _train(plain_model, _batches(sizes), lambda fn, inputs, model, opt: fn(*inputs), accumulate=2)
    reports = []
    steps = PlannedSteps("70%", "autoswap:doa", report=reports.append, measure=True, min_bytes=16 * 1024)
    planned = _train(planned_model, _batches(sizes), steps.run, accumulate=2)
    assert all(torch.equal(a, b) for a, b in zip(plain, planned))
    assert all(torch.equal(a, b) for a, b in zip(plain_model.parameters(), planned_model.parameters()))
    kinds = sorted(p["batch"] for p in steps.stats())
    assert kinds == ["256x64, 256", "256x64, 256 (adding to gradients)", "512x64, 512",
                     "512x64, 512 (adding to gradients)"]
    assert sorted(r["memplan/batch"] for r in reports) == kinds  # one report per plan, after its first step
    for plan in steps.stats():
        assert plan["decisions"] > 0
        assert all(s["measured_peak_bytes"] <= plan["budget_bytes"] * 1.02 for s in plan["steps_measured"])


def test_the_kind_says_what_the_ops_depend_on():
    model = _model()
    (x, y), = _batches([8])
    assert kind_of((x, y), model) == kind_of((x.clone(), y.clone()), model)
    assert kind_of((x, y), model) != kind_of((x[:4], y[:4]), model)
    _step(model)(x, y)
    assert kind_of((x, y), model).grads_present


def test_a_kind_that_cannot_be_planned_runs_plainly_and_says_why(caplog):
    model, reference = _model(), _model()
    (x, y), = _batches([64])
    reports = []
    steps = PlannedSteps("1KiB", "autoswap:doa", report=reports.append)
    assert torch.equal(steps.run(_step(model), (x, y), model, None), _step(reference)(x, y))
    fallback, report = reports  # its planner's failure, then auto's too
    assert "autoswap:doa" in fallback["memplan/fallback"]
    assert report["memplan/batch"] == "64x64, 64" and "1.00 KiB" in report["memplan/unplanned"]
    assert "autoswap:doa:" in report["memplan/unplanned"] and "auto:" in report["memplan/unplanned"]
    assert "run unplanned" in caplog.text
    assert steps.stats() == []


def test_a_kind_its_planner_cannot_meet_is_planned_by_auto_and_trains_as_plain_training(caplog):
    # autoswap:doa moves nothing under 1 MiB, and the MLP's activations are smaller: at 70% it has no plan
    model, reference = _model(), _model()
    reports = []
    steps = PlannedSteps("70%", "autoswap:doa", report=reports.append, measure=True)
    plain = _train(reference, _batches([512, 512]), lambda fn, inputs, model, opt: fn(*inputs))
    planned = _train(model, _batches([512, 512]), steps.run)
    assert all(torch.equal(a, b) for a, b in zip(plain, planned))
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters()))
    assert "no candidates" in reports[0]["memplan/fallback"] and "planned by auto" in caplog.text
    assert reports[1]["memplan/planner"] == "auto"
    (plan,) = steps.stats()
    assert all(s["measured_peak_bytes"] <= plan["budget_bytes"] * 1.02 for s in plan["steps_measured"])


def test_strict_raises_at_the_first_step_of_a_kind_no_plan_meets():
    model, reference = _model(), _model()
    (x, y), = _batches([64])
    steps = PlannedSteps("1KiB", "autoswap:doa", strict=True)
    with pytest.raises(MemplanError, match="cannot be planned \\(strict\\).*1.00 KiB"):
        steps.run(_step(model), (x, y), model, None)
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters()))  # nothing trained


def test_more_kinds_than_max_plans_run_unplanned():
    model = _model()
    reports = []
    steps = PlannedSteps(None, "none", max_plans=1, report=reports.append)
    for x, y in _batches([32, 16]):
        steps.run(_step(model), (x, y), model, None)
        model.zero_grad(set_to_none=True)
    assert [r.get("memplan/planner") for r in reports] == ["none", None]
    assert "max_plans" in reports[1]["memplan/unplanned"]


def test_the_optimizer_step_outside_the_plan_is_warned_about_when_its_memory_alone_is_over(caplog):
    """Parameters, gradients and optimizer state are all resident during the optimizer step, which
    the plan does not cover: a budget below them is said to be (the plan sends the optimizer state,
    which forward and backward do not touch, to the host meanwhile)."""
    model = _model()
    opt = torch.optim.Adam(model.parameters())
    (x, y), = _batches([8])
    held = 4 * sum(p.numel() * 4 for p in model.parameters())  # parameters, gradients, two moments
    steps = PlannedSteps(int(held * 0.9), "autoswap:doa", report=lambda entry: None, min_bytes=1024)
    steps.run(_step(model), (x, y), model, opt)
    assert len(steps.stats()) == 1  # planned
    assert "the optimizer step, which runs outside the plan, holds them all" in caplog.text


def test_begin_and_end_run_a_step_the_framework_runs_itself():
    plain_model, planned_model = _model(), copy.deepcopy(_model())
    sizes = [512, 512, 512]
    steps = PlannedSteps("70%", "autoswap:doa", measure=True, min_bytes=16 * 1024)

    def framework_runs(fn, inputs, model, opt):  # the framework calls its own step between the hooks
        steps.begin(kind_of(inputs, model), fn, inputs, model, opt)
        try:
            return fn(*inputs)
        finally:
            steps.end()

    plain = _train(plain_model, _batches(sizes), lambda fn, inputs, model, opt: fn(*inputs))
    planned = _train(planned_model, _batches(sizes), framework_runs)
    assert all(torch.equal(a, b) for a, b in zip(plain, planned))
    assert all(torch.equal(a, b) for a, b in zip(plain_model.parameters(), planned_model.parameters()))
    (plan,) = steps.stats()
    assert len(plan["steps_measured"]) == len(sizes) and not steps.in_step
    assert all(s["measured_peak_bytes"] <= plan["budget_bytes"] * 1.02 for s in plan["steps_measured"])


@pytest.mark.parametrize("budget, planner, options, needle", [
    ("70 percent", "autoswap:doa", {}, "70 percent"),
    ("70%", "bogus", {}, "bogus"),
    ("70%", "sqrt-n", {"min_bytes": 1024}, "no parameter 'min_bytes'"),
])
def test_bad_settings_are_refused_at_once(budget, planner, options, needle):
    with pytest.raises(MemplanError, match=needle):
        PlannedSteps(budget, planner, **options)
