"""`memplan run --baseline`, `memplan maxbatch`, and PyTorch's own tools as baselines."""

from __future__ import annotations

import json

import pytest
import torch

from memplan.cli import main
from memplan.workflows.torch_tools import baseline_installed, top_level_blocks
from memplan.workflows.maxbatch import search
from memplan.workflows.measure import Metering, measure_steps
from memplan.workflows.workloads import trace_workload

from tests.exec.helpers import state_diffs, tiny_workload

STEPS = 2


@pytest.mark.parametrize("threshold", [0, 1, 2, 5, 37, 64, 100])
def test_search_finds_the_largest_fitting_batch(threshold):
    calls = []

    def fits(b):
        calls.append(b)
        return b <= threshold

    assert search(fits, limit=100) == threshold
    assert max(calls) <= 100


def _train(baseline=None, fraction=1.0):
    w = tiny_workload()
    torch.manual_seed(3)
    with baseline_installed(baseline, w.model, fraction, torch.device("cpu")) if baseline else _null():
        for i in range(STEPS):
            w.step(*w.make_inputs(w.batch, seed=100 + i))
    return w.model


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("baseline", ["save-on-cpu", "torch-checkpoint", "sac-compute"])
def test_pytorch_baselines_train_like_plain_training(baseline):
    ref, got = _train(), _train(baseline)
    diffs = state_diffs(got, ref)
    params = {n for n, _ in ref.named_parameters()}
    assert max(diffs[n] for n in params) <= 1e-6
    assert all("forward" not in m.__dict__ for m in got.modules())  # patches undone


def test_torch_checkpoint_wraps_blocks_not_the_root():
    names = [n for n, _ in top_level_blocks(tiny_workload().model)]
    assert names == ["stem", "blocks.0", "blocks.1", "blocks.2"]


def test_compile_budget_is_wired_and_undone():
    import torch._functorch.config as functorch_config

    model = tiny_workload().model
    before = functorch_config.activation_memory_budget
    with baseline_installed("compile-budget", model, 0.4, torch.device("cpu")):
        assert functorch_config.activation_memory_budget == pytest.approx(0.4)
        assert "forward" in model.__dict__
    assert functorch_config.activation_memory_budget == before and "forward" not in model.__dict__


def test_compile_budget_takes_its_own_fraction():
    import torch._functorch.config as functorch_config

    with baseline_installed("compile-budget:0.3", tiny_workload().model, 0.9, torch.device("cpu")):
        assert functorch_config.activation_memory_budget == pytest.approx(0.3)


def test_sac_compute_saves_compute_ops_and_recomputes_the_rest():
    from torch.utils.checkpoint import CheckpointPolicy

    from memplan.workflows.torch_tools import _save_compute_policy

    aten = torch.ops.aten
    assert _save_compute_policy(None, aten.convolution.default) == CheckpointPolicy.MUST_SAVE
    assert _save_compute_policy(None, aten.addmm.default) == CheckpointPolicy.MUST_SAVE
    assert _save_compute_policy(None, aten.relu.default) == CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.parametrize("name", ["magic", "compile-budget:0", "compile-budget:1.5", "compile-budget:x",
                                  "sac-compute:0.5"])
def test_unknown_baseline_is_one_clear_error(capsys, name):
    assert main(["run", "vgg11-cifar", "--batch", "1", "--baseline", name]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and repr(name) in err[0]


def test_the_allocator_meter_agrees_with_the_dispatch_meter_on_eager_training():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters())

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    make = lambda i: (torch.randn(32, 64), torch.randint(0, 10, (32,)))  # noqa: E731
    dispatch = measure_steps(step, make, 3, model, opt, 0)
    allocator = measure_steps(step, make, 3, model, opt, 0, Metering(compiled=True))
    assert [r["meter"] for r in allocator] == ["allocator"] * 3
    # matmuls allocate (almost) nothing inside themselves: both meters see the same bytes, to a
    # few scalars (12 bytes of 227,760 here)
    assert allocator[-1]["measured_peak_bytes"] == pytest.approx(dispatch[-1]["measured_peak_bytes"], rel=1e-3)
    assert dispatch[-1]["measured_peak_bytes"] > 0
    # a CPU convolution's own scratch memory is seen by the allocator only
    w = tiny_workload()
    conv = measure_steps(w.step, lambda i: w.make_inputs(w.batch, seed=3 + i), 2, w.model, w.optimizer, 0)
    conv_alloc = measure_steps(w.step, lambda i: w.make_inputs(w.batch, seed=5 + i), 2, w.model, w.optimizer, 0,
                               Metering(compiled=True))
    assert conv_alloc[-1]["measured_peak_bytes"] >= conv[-1]["measured_peak_bytes"]


def test_the_allocator_meter_counts_once_what_an_earlier_metered_step_left_alive():
    # Adam makes its state in the first step: the profiler's running total keeps it from then on,
    # and every later step starts with it counted already among the tensors it tracks
    def fresh():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        opt = torch.optim.Adam(model.parameters())

        def step(x, y):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        return step, model, opt

    make = lambda i: (torch.randn(32, 64), torch.randint(0, 10, (32,)))  # noqa: E731
    step, model, opt = fresh()
    allocator = measure_steps(step, make, 3, model, opt, 0, Metering(compiled=True))
    step, model, opt = fresh()
    dispatch = measure_steps(step, make, 3, model, opt, 0)
    for a, d in zip(allocator, dispatch):
        assert a["measured_peak_bytes"] == pytest.approx(d["measured_peak_bytes"], rel=1e-3)


@pytest.mark.slow  # torch.compile of a small net: about 20 s
def test_compile_budget_compiles_on_the_cpu_and_is_measured(capsys):
    # Under the dispatch-mode meter Dynamo would skip the frame (eager training measured as
    # compiled); the allocator meter lets it compile and sees inductor's buffers.
    from torch._dynamo.utils import counters

    counters.clear()
    assert main(["run", "vgg11-cifar", "--batch", "2", "--steps", "2", "--baseline", "compile-budget:0.5",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert counters["stats"]["unique_graphs"] > 0  # it really compiled
    assert [s["meter"] for s in out["steps"]] == ["allocator", "allocator"] and out["measured_peak_bytes"] > 0


@pytest.mark.parametrize("baseline", ["sac-compute", "save-on-cpu"])
def test_baseline_runs_train_and_report_a_measured_peak(capsys, baseline):
    assert main(["run", "vgg11-cifar", "--batch", "2", "--steps", "2", "--baseline", baseline, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["baseline"] == baseline and out["measured_peak_bytes"] > 0
    assert len(out["steps"]) == 2 and all(s["measured_peak_bytes"] > 0 for s in out["steps"])


def test_sac_compute_trains_a_real_model():
    w = tiny_workload()
    before = [p.detach().clone() for p in w.model.parameters()]
    with baseline_installed("sac-compute", w.model, 1.0, torch.device("cpu")):
        loss = w.step(*w.make_inputs(w.batch, seed=5))
    assert torch.isfinite(loss)
    assert all(not torch.equal(a, p) for a, p in zip(before, w.model.parameters()))


def test_maxbatch_answers_from_planning_on_cpu(capsys):
    peak2 = trace_workload("vgg11-cifar", 2, fake=True).peak_load_bytes
    peak3 = trace_workload("vgg11-cifar", 3, fake=True).peak_load_bytes
    memory = (peak2 + peak3) // 2  # batch 2 fits unplanned, batch 3 does not
    assert main(["maxbatch", "vgg11-cifar", "--memory", str(memory), "--planner", "none", "--limit", "8",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["max_batch"] == 2 and out["source"] in ("planned", "simulated")
    assert {p["batch"]: p["fits"] for p in out["probes"]}[3] is False


@pytest.mark.slow
def test_run_reports_measured_against_simulated_peaks_and_trains_like_plain_training(capsys):
    assert main(["run", "vgg11-cifar", "--batch", "2", "--planner", "autoswap:doa", "--budget", "70%",
                 "--steps", "3", "--check", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ex = out["executor"]
    assert out["max_param_diff"] == 0.0 and out["max_buffer_diff"] == 0.0
    assert ex["released"] > 0 and ex["diverged_steps"] == ex["unresolved"] == 0
    assert out["within_budget"] and len(out["steps"]) == 3
    assert all(s["measured_peak_bytes"] <= out["budget_bytes"] for s in out["steps"])
    assert out["simulated_peak_bytes"] == out["predicted"]["peak_load_bytes"]


def test_run_check_fails_in_one_line_when_the_run_exceeds_its_budget(capsys, monkeypatch):
    import memplan.workflows.run as run

    monkeypatch.setattr(run, "BUDGET_TOLERANCE", -0.5)  # pretend the run overshot
    assert main(["run", "vgg11-cifar", "--batch", "1", "--planner", "none", "--steps", "1", "--check"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "check failed" in err[0]


def test_run_takes_model_options(capsys):
    args = ["run", "transformer-encoder", "--batch", "2", "--steps", "1", "--json", "--config", "seq_len=8"]
    assert main(args + ["num_layers=1"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert main(args + ["num_layers=2"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert 0 < one["trace_peak_bytes"] < two["trace_peak_bytes"]  # the option reached the model
    assert main(args + ["no_such_option=1"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
