"""The CPU as a measured device: `calibrate --device cpu`, op times of a real CPU trace, a
run's measured beside simulated step time, and the meter against the plan (issue 17)."""

from __future__ import annotations

import json

import pytest
import torch

from memplan.cli import main
from memplan.cost import calibrate as cal
from memplan.cost.model import Cost
from memplan.cost.profiles import get_profile, profile_to_json
from memplan.exec.interpreted import InterpretedRunner
from memplan.tracing.io import write_trace
from memplan.tracing.optimes import time_ops
from memplan.tracing.tracer import trace
from memplan.workflows.optimize import optimize, trace_step
from memplan.workflows.measure import Metering
from memplan.workflows.run import measure_steps, run_workload

from tests.exec.helpers import plain_step_meter_peak, swap_all_plan, tiny_workload

# A CPU's figures as `calibrate --device cpu` would measure them (the copy is the host link).
CPU = cal.Measurements(h2d_bytes_per_s=8e9, d2h_bytes_per_s=8e9, copy_latency_s=20e-6, launch_s=3e-6,
                       fp32_flops=60e9, tf32_flops=60e9, bf16_flops=30e9, hbm_bytes_per_s=16e9)
SMALL_TRANSFORMER = {"d_model": 32, "nhead": 2, "seq_len": 16, "vocab_size": 50}


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("cpu") / "cpu.json"
    profile = cal.profile_from(CPU, name="cpu", description="test CPU", memory_bytes=8 * 2**30, kind="cpu")
    path.write_text(json.dumps(profile_to_json(profile)))
    return path


def test_calibrate_cpu_writes_a_sane_profile(tmp_path, capsys):
    out = tmp_path / "cpu.json"
    assert main(["calibrate", "--device", "cpu", "-o", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    profile = get_profile(str(out))
    assert profile.kind == "cpu" and profile.calibrated and printed["kind"] == "cpu"
    # Physical sanity for any CPU: 0.1 GFLOP/s-10 TFLOP/s, host copies 0.1-1000 GB/s, an
    # eager op's dispatch 0.1-1000 us, and the memory bandwidth is that of the copy (read + write).
    assert 1e8 < profile.fp32_flops < 1e13
    assert 1e8 < profile.h2d_bytes_per_s == profile.d2h_bytes_per_s < 1e12
    assert profile.hbm_bytes_per_s == pytest.approx(2 * profile.h2d_bytes_per_s)
    assert 1e-7 < profile.launch_s < 1e-3 and 1e-7 < profile.copy_latency_s < 1e-2
    assert profile.memory_bytes > 0
    # the hooked executor's own prices, fitted on its runs: microseconds, not zero both
    assert 0 <= profile.hook_call_s < 1e-3 and 0 <= profile.action_s < 1e-3 and profile.hook_call_s + profile.action_s > 0
    # the interpreted executor's, fitted on its runs: microseconds an op, not zero both
    assert 0 <= profile.mode_op_s < 1e-3 and 0 <= profile.guard_op_s < 1e-3 and profile.mode_op_s + profile.guard_op_s > 0
    assert 0 < profile.record_op_s < 1e-3  # the executor's own clock on its recording of ops to replay


@pytest.mark.parametrize("call, action", [(5e-6, 2e-6), (1e-6, 9e-6)])
def test_the_executor_prices_are_the_two_plans_hook_calls_and_actions_solved(call, action):
    from memplan.workflows.calibrate_executor import _per_call_and_action

    acts = {"calls": 230, "actions": 92, "copies_s": 1e-5}  # activations: hook calls beside each action
    state = {"calls": 2, "actions": 192, "copies_s": 3e-5}  # state between steps: actions at two calls
    extra = [p["calls"] * call + p["actions"] * action + p["copies_s"] for p in (acts, state)]
    assert _per_call_and_action(extra[0], acts, extra[1], state) == pytest.approx((call, action))
    # two plans of one mix do not tell the two apart: one price carries all
    assert _per_call_and_action(extra[0], acts, extra[0], acts) == pytest.approx((0.0, (extra[0] - 1e-5) / 92))


@pytest.mark.parametrize("per_op, guard", [(3e-6, 1e-6), (1e-6, 4e-6)])
def test_the_interpreted_prices_are_the_two_plans_ops_and_ops_guarded_solved(per_op, guard):
    from memplan.workflows.calibrate_executor import _per_op_and_guard

    few = {"ops": 552, "guarded_ops": 6, "hooks": 96, "actions": 3, "copies_s": 1e-6}  # one parameter away briefly
    every = {"ops": 552, "guarded_ops": 400, "hooks": 96, "actions": 192, "copies_s": 3e-5}  # state between steps
    hook_s, action_s = 1e-6, 4e-6
    extra = [p["ops"] * per_op + p["guarded_ops"] * guard + p["hooks"] * hook_s + p["actions"] * action_s
             + p["copies_s"] for p in (few, every)]
    assert _per_op_and_guard(extra[0], few, extra[1], every, hook_s, action_s) == pytest.approx((per_op, guard))
    # one plan twice does not tell them apart: the price per op carries all
    alone = (extra[0] - 96 * hook_s - 3 * action_s - 1e-6) / 552
    assert _per_op_and_guard(extra[0], few, extra[0], few, hook_s, action_s) == pytest.approx((alone, 0.0))


def test_a_cpu_profile_drives_planners_and_the_simulator_like_a_gpu_one(tmp_path, cpu_profile, capsys):
    w = tiny_workload()
    path = tmp_path / "tiny.jsonl"
    write_trace(trace_step(w.step, w.inputs, w.model, w.optimizer), path)
    for planner, budget in (("sqrt-n", "80%"), ("checkpoint-all", "100%"), ("capuchin", "100%")):
        plan = tmp_path / f"{planner}.json"
        assert main(["plan", str(path), "--planner", planner, "--budget", budget, "--profile", str(cpu_profile),
                     "-o", str(plan)]) == 0, planner
        assert main(["simulate", str(path), "--plan", str(plan), "--profile", str(cpu_profile), "--json"]) == 0
        assert json.loads(capsys.readouterr().out.splitlines()[-1])["feasible"] is not False


def test_a_real_cpu_trace_has_measured_op_times_that_the_cost_model_uses(cpu_profile):
    w = tiny_workload()
    t = trace(w.step, *w.inputs, fake=False, model=w.model, optimizer=w.optimizer, time_repeats=2)
    durations = [op.duration_s for op in t.ops]
    assert all(d is not None and d > 0 for d in durations)
    assert t.meta["time_repeats"] == 2
    cost = Cost.for_trace(t, str(cpu_profile))
    assert cost.durations.tolist() == durations  # measured, not the roofline
    untimed = trace(w.step, *w.inputs, fake=False, model=w.model, optimizer=w.optimizer)
    assert all(op.duration_s is None for op in untimed.ops)


def test_timed_iterations_that_run_other_ops_are_discarded():
    x = torch.ones(4)
    assert time_ops(lambda: x.add(1), (), ["aten.mul.Tensor"], repeats=2) is None
    times = time_ops(lambda: x.add(1).mul(2), (), ["aten.add.Tensor", "aten.mul.Tensor"], repeats=3)
    assert times is not None and len(times) == 2 and all(t > 0 for t in times)


def test_run_reports_measured_and_simulated_step_time_under_a_cpu_profile(cpu_profile):
    out = run_workload("transformer-encoder", 2, planner="sqrt-n", budget="90%", steps=2, device="cpu",
                       profile=str(cpu_profile), config={**SMALL_TRANSFORMER, "num_layers": 2}, timed_steps=2)
    assert out["op_times"] == "measured" and out["profile"] == "cpu"
    assert len(out["timed_step_s"]) == 2 and out["measured_step_s"] > 0
    assert out["simulated_step_s"] == out["predicted"]["time_s"] > 0
    assert out["measured_peak_bytes"] == out["simulated_peak_bytes"]


def test_run_cli_json_has_the_step_times(cpu_profile, capsys):
    assert main(["run", "kmeans", "--batch", "64", "--steps", "2", "--profile", str(cpu_profile),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measured_step_s"] > 0 and out["simulated_step_s"] > 0 and out["op_times"] == "measured"


# --- the meter (acceptance) ---------------------------------------------------------------------
# tests/exec/test_interpreted.py::test_the_meter_measures_the_traced_peak_of_plain_training covers TinyNet.

@pytest.mark.parametrize("name", ["vgg11-cifar", "transformer-encoder"])
def test_the_meter_measures_the_traced_peak_of_plain_zoo_training(name):
    config = SMALL_TRANSFORMER if name == "transformer-encoder" else {}
    from memplan.zoo.registry import get_workload

    w = get_workload(name, 2, seed=0, **config)
    traced = trace_step(w.step, w.inputs, w.model, w.optimizer)
    assert plain_step_meter_peak(w) == traced.peak_load_bytes


def test_a_swap_the_executor_skips_is_caught_by_the_meter(monkeypatch):
    """A storage the plan swaps out but the executor keeps: the measured peak exceeds the simulated."""
    w = tiny_workload()
    t = trace_step(w.step, w.inputs, w.model, w.optimizer)
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, trace=t, plan=swap_all_plan(t),
                    measure=False)
    honest = _measured_peak(step, w)
    simulated = step.program.predicted.peak_load_bytes
    assert honest == simulated
    largest = max(step.program.decisions, key=lambda d: t.storages[d.storage].nbytes).storage
    swap_out = InterpretedRunner._swap_out

    def keeps_one(self, entry, k, found):
        if entry.sid != largest:
            swap_out(self, entry, k, found)

    monkeypatch.setattr(InterpretedRunner, "_swap_out", keeps_one)
    assert _measured_peak(step, w) > simulated
    step.close()


def _measured_peak(step, w) -> int:
    records = measure_steps(step, lambda i: w.make_inputs(w.batch, seed=10 + i), 2, w.model, w.optimizer, 0,
                            Metering(host=step.runtime.host_buffers()))
    return max(r["measured_peak_bytes"] for r in records)


def test_cpu_clock_times_steps_and_ops_on_the_main_threads_cpu_time(cpu_profile, capsys):
    assert main(["run", "kmeans", "--batch", "64", "--steps", "1", "--timed-steps", "2", "--clock", "cpu",
                 "--profile", str(cpu_profile), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["clock"] == "cpu" and len(out["timed_step_s"]) == 2 and out["op_times"] == "measured"
    assert main(["run", "kmeans", "--batch", "64", "--clock", "sundial"]) == 2
    assert "invalid choice" in capsys.readouterr().err
