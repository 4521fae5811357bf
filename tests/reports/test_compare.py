"""`memplan compare`: the report, its Pareto fronts, the resumable cache and bad input."""

from __future__ import annotations

import json

import pytest

import memplan.reports.compare as compare
from memplan.cli import main
from memplan.reports.compare_report import pareto, with_measured_overhead

SMALL = ["--models", "vgg11-cifar", "--planners", "none,sqrt-n,dtr", "--run-planners", "", "--baselines", "",
         "--maxbatch-planners", "none,dtr", "--budgets", "70%", "--sim-batch", "8", "--run-batch", "2",
         "--steps", "2", "--maxbatch-limit", "16", "--json"]


def _compare(capsys, out, *extra):
    assert main(["compare", "--out", str(out), *SMALL, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_report_then_a_rerun_computes_nothing(capsys, tmp_path, monkeypatch):
    first = _compare(capsys, tmp_path)
    kinds = [(p["kind"], p["method"], p["budget"]) for p in first["points"]]
    assert kinds == [("simulated", "none", "-"), ("simulated", "sqrt-n", "70%"), ("simulated", "dtr", "70%"),
                     ("measured", "none", "-"), ("maxbatch", "none", "peak@8"), ("maxbatch", "dtr", "peak@8")]
    assert first["computed"] == 6 and first["cached"] == 0
    by = {(p["kind"], p["method"]): p for p in first["points"]}
    assert by[("simulated", "none")]["overhead"] == 0.0 and by[("simulated", "none")]["source"] == "simulated (h100)"
    assert by[("measured", "none")]["peak_bytes"] > 0 and by[("measured", "none")]["source"] == "measured (CPU)"
    assert by[("maxbatch", "none")]["max_batch"] == 8  # the cap is none's own peak at batch 8
    assert by[("maxbatch", "dtr")]["max_batch"] >= 8
    report = (tmp_path / "compare.md").read_text()
    assert "## vgg11-cifar" in report and "simulated (h100)" in report and "measured (CPU)" in report
    assert (tmp_path / "compare-vgg11-cifar.png").stat().st_size > 0
    # measured points plan for the machine they run on: this CPU, calibrated once into the folder
    assert json.loads((tmp_path / "cpu_profile.json").read_text())["kind"] == "cpu"
    assert any(k.startswith("measured|") and k.endswith("|plan=cpu_profile")
               for k in json.loads((tmp_path / "compare.json").read_text())["points"])

    def no_work(task, settings):
        raise AssertionError(f"recomputed {task.key}")

    monkeypatch.setattr(compare, "compute_point", no_work)
    again = _compare(capsys, tmp_path)
    assert again["computed"] == 0 and again["cached"] == 6 and again["points"] == first["points"]


def test_a_rerun_computes_only_the_missing_points(capsys, tmp_path, monkeypatch):
    cache = tmp_path / "compare.json"
    cache.write_text(json.dumps({"schema": "memplan.compare", "version": 1, "points": {}}))
    calls = []
    monkeypatch.setattr(compare, "compute_point", lambda task, s: calls.append(task.key) or {"error": "skipped"})
    _compare(capsys, tmp_path)
    data = json.loads(cache.read_text())
    dropped = sorted(data["points"])[0]
    del data["points"][dropped]
    cache.write_text(json.dumps(data))
    calls.clear()
    out = _compare(capsys, tmp_path)
    assert calls == [dropped] and out["computed"] == 1


def test_pareto_front_keeps_the_points_no_other_beats_on_both():
    points = [{"peak_bytes": 100, "overhead": 0.0}, {"peak_bytes": 50, "overhead": 0.2},
              {"peak_bytes": 60, "overhead": 0.3}, {"peak_bytes": 50, "overhead": 0.2}, {"peak_bytes": 40, "overhead": 1.0}]
    assert pareto(points) == {0, 1, 3, 4}  # 2 is beaten by 1; equal points both stay


def test_measured_overhead_is_against_the_measured_none_run():
    points = [{"method": "none", "step_s": 2.0}, {"method": "dtr", "step_s": 3.0}, {"method": "x", "error": "e"}]
    got = with_measured_overhead(points)
    assert got[0]["overhead"] == 0.0 and got[1]["overhead"] == pytest.approx(0.5) and "overhead" not in got[2]


@pytest.mark.parametrize("option, value, says", [("--planners", "none,magic", "magic"),
                                                 ("--baselines", "compile-budget:7", "compile-budget:7"),
                                                 ("--run-planners", "nope", "nope")])
def test_bad_names_are_one_error_line_and_no_files(capsys, tmp_path, option, value, says):
    out = tmp_path / "report"
    args = ["compare", "--out", str(out), *SMALL]
    args[args.index(option) + 1] = value
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
    assert not out.exists()


def test_a_foreign_cache_is_one_error_line(capsys, tmp_path):
    (tmp_path / "compare.json").write_text("[1, 2]")
    assert main(["compare", "--out", str(tmp_path), *SMALL]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a memplan comparison cache" in err[0]


def test_a_pytorch_tool_named_like_a_planner_runs_as_the_tool(monkeypatch):
    # `save-on-cpu` is both PyTorch's tool and a memplan planner: the measured point of the tool
    # must run PyTorch's save_on_cpu (baseline=...), the planner's point memplan's plan.
    calls = []

    def fake_run(model, batch, *, planner, options, **_):
        calls.append((planner, options.baseline))
        return {"measured_peak_bytes": 1, "measured_step_s": 1.0, "simulated_peak_bytes": None,
                "trace_peak_bytes": 1, "budget_bytes": None}

    monkeypatch.setattr(compare, "run_workload", fake_run)
    s = compare.CompareSettings(models=("vgg11-cifar",), sim_planners=(), run_planners=("save-on-cpu",),
                                baselines=("save-on-cpu",), maxbatch_planners=(), budgets=("70%",))
    for task in compare.tasks(s):
        compare.compute_point(task, s)
    assert calls == [("none", None), ("save-on-cpu", None), ("none", "save-on-cpu")]
    assert [t.method for t in compare.tasks(s)] == ["none", "save-on-cpu", "torch:save-on-cpu"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU path")
@pytest.mark.parametrize("device, says", [("cuda", "no CUDA device"), ("meta", "not supported"),
                                          ("nonsense", "unknown device")])
def test_device_without_a_gpu_is_one_error_line_and_no_files(capsys, tmp_path, device, says):
    out = tmp_path / "report"
    assert main(["compare", "--out", str(out), *SMALL, "--device", device]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
    assert not out.exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU path")
def test_settings_that_measure_on_a_gpu_fail_before_any_work_without_one(tmp_path):
    s = compare.CompareSettings(models=("vgg11-cifar",), device="cuda", run_profile=compare.GPU_PROFILE)
    with pytest.raises(compare.MemplanError, match="no CUDA device"):
        compare.compare(s, tmp_path / "report")
    assert not (tmp_path / "report").exists()
    with pytest.raises(compare.MemplanError, match="needs --device cuda"):
        compare.compare(compare.CompareSettings(run_profile=compare.GPU_PROFILE), tmp_path / "report")


def test_gpu_points_are_measured_on_the_gpu_under_other_keys(monkeypatch, tmp_path):
    # The GPU path without a GPU: its device checks, its calibration and its training are stood in for.
    from memplan.cost.profiles import get_profile

    runs = []

    def fake_run(model, batch, *, planner, options, **_):
        runs.append((planner, options.baseline, options.device, options.profile))
        return {"measured_peak_bytes": 1, "measured_step_s": 1.0, "simulated_peak_bytes": None,
                "trace_peak_bytes": 1, "budget_bytes": None}

    monkeypatch.setattr(compare, "run_workload", fake_run)
    monkeypatch.setattr(compare, "check_device", lambda s: None)
    monkeypatch.setattr(compare, "device_name", lambda device: "Test GPU" if device == "cuda" else "CPU")
    monkeypatch.setattr(compare, "_release_cached_memory", lambda device: None)
    monkeypatch.setattr(compare, "calibrate", lambda gpu=0: get_profile("h100"))
    monkeypatch.setattr(compare, "with_executor_costs", lambda profile, device: profile)  # it trains on the device
    base = dict(models=("vgg11-cifar",), sim_planners=(), run_planners=("dtr",), baselines=("torch-checkpoint",),
                maxbatch_planners=(), budgets=("70%",))
    gpu = compare.compare(compare.CompareSettings(**base, device="cuda", run_profile=compare.GPU_PROFILE), tmp_path,
                          progress=False)
    profile = str(tmp_path / compare.GPU_PROFILE_FILE)
    assert runs == [("none", None, "cuda", profile), ("dtr", None, "cuda", profile),
                    ("none", "torch-checkpoint", "cuda", profile)]
    assert {p["source"] for p in gpu["points"]} == {"measured (Test GPU)"}
    keys = json.loads((tmp_path / "compare.json").read_text())["points"]
    assert all(k.endswith("|plan=gpu_profile|device=cuda") for k in keys)
    runs.clear()  # the same comparison on the CPU is other points, measured there
    monkeypatch.setattr(compare, "_with_run_profile", lambda s, folder: s)
    cpu = compare.compare(compare.CompareSettings(**base, run_profile="h100"), tmp_path, progress=False)
    assert cpu["computed"] == 3 and [r[2] for r in runs] == ["cpu"] * 3
    assert {p["source"] for p in cpu["points"]} == {"measured (CPU)"}


def test_the_report_names_the_gpu_the_points_were_measured_on(tmp_path):
    from memplan.reports.compare_report import write_report

    points = [{"kind": "measured", "model": "m", "method": "none", "budget": "-", "batch": 8,
               "source": "measured (Test GPU)", "peak_bytes": 2**20, "step_s": 1.0}]
    write_report({"points": points}, tmp_path, "memplan compare --device cuda")
    report = (tmp_path / "compare.md").read_text()
    assert "### Measured (Test GPU): batch 8" in report and "training on this machine's Test GPU" in report
    assert "CPU" not in report.replace(" CPUs, load", "")


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_compare_measures_on_the_gpu(capsys, tmp_path):
    import torch

    args = ["compare", "--out", str(tmp_path), *SMALL, "--device", "cuda", "--baselines", "save-on-cpu",
            "--maxbatch-planners", ""]
    assert main(args) == 0
    points = json.loads(capsys.readouterr().out)["points"]
    measured = [p for p in points if p["kind"] == "measured"]
    assert [p["method"] for p in measured] == ["none", "torch:save-on-cpu"]
    assert all(p["source"] == f"measured ({torch.cuda.get_device_name()})" and p["peak_bytes"] > 0 for p in measured)
    assert json.loads((tmp_path / "gpu_profile.json").read_text())["calibrated"]
