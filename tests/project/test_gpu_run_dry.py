"""Issue 36 without a GPU: `gpu_run.sh --dry-run` runs every row of the GPU run on the CPU, and
every paper's planner (the seed papers the registry cites) has a row; issue 51's sanitized case runs
on the CPU's CUDA stand-in and keeps CUDA's rules."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memplan.planners.base import get_planner, known_planners

ROOT = Path(__file__).resolve().parent.parent.parent
BENCH = ROOT / "benchmarks"
# the rows issue 36 names: every paper's planner, and the strict form on these models
NAMED = {"vdnn:conv", "vdnn++:conv", "dqn:pretrained", "dqn:refined", "capuchin+ucudnn:wd", "home:fast", "capuchin",
         "dtr", "autoswap:doa", "autoswap:doa+smartpool", "capuchin+smartpool"}
STRICT_MODELS = {"transformer-encoder", "resnet50", "hf:gpt2"}


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


gpu_budget = _load("gpu_budget")
gpu_pytest = _load("gpu_pytest")


def _rows():
    """(group, case, planner, params) of every row of the GPU run."""
    return [(g, case, planner, params) for g, spec in gpu_budget.GROUPS.items() for case, planner, params in spec[5]]


def _papers(planner: str) -> set[str]:
    """The seed papers (000-004) whose own method a planner (or a part of X+Y) is, by its registered summary."""
    if planner not in known_planners():  # a composition X+Y, split as the registry splits it
        base, _, other = planner.rpartition("+")
        return _papers(base) | _papers(other)
    summary = get_planner(planner).summary
    if re.search(r"\bours\b|beyond paper|as HOME .* describes|as paper \d+ ran it", summary):
        return set()  # memplan's own, or a baseline as a paper ran it
    family = planner.split(":")[0]
    if "paper" not in summary and family != planner and family in known_planners():
        return _papers(family)  # home:fast is HOME's swarm under a time limit
    return set(re.findall(r"paper (\d{3})", summary))


def test_every_seed_paper_planner_has_a_row():
    seed_papers = {p for name in known_planners() for p in _papers(name)}
    assert seed_papers == {"000", "001", "002", "003", "004"}
    covered = {p for _, _, planner, _ in _rows() for p in _papers(planner)}
    assert covered == seed_papers
    assert NAMED <= {planner for _, _, planner, _ in _rows()}
    strict = {gpu_budget.GROUPS[g][0] for g, case, _, _ in _rows() if case == "strict"}
    assert strict == STRICT_MODELS


def test_ucudnn_runs_the_cudnn_source_beside_cudnns_own_choice_at_the_same_workspace():
    ucudnn = [params for _, case, _, params in _rows() if case == "ucudnn"]
    assert [p.get("policy") for p in ucudnn] == [None, "undivided"]
    assert {p["source"] for p in ucudnn} == {"cudnn"} and len({p["workspace"] for p in ucudnn}) == 1


def test_pool_rows_plan_on_a_saved_trace_of_a_group_that_runs_before_them():
    order = list(gpu_budget.GROUPS)
    for group, spec in gpu_budget.GROUPS.items():
        pooled = ["pool" in get_planner(planner).decides for _, planner, _ in spec[5]]
        assert not any(pooled) or (spec[6] is not None and order.index(spec[6]) < order.index(group))


def test_the_targets_of_a_row():
    step = {"measured_peak_bytes": 100, "measured_peak_reserved_bytes": 105}
    row = {"budget_bytes": 100, "steps": [{"measured_peak_bytes": 130, "measured_peak_reserved_bytes": 130}, step],
           "final_plan_from_step": 1, "executor": {"diverged_steps": 0}, "max_param_diff": 0.0}
    assert gpu_budget.targets(row) == {"allocated_over": 0.0, "reserved_over": pytest.approx(0.05), "met": True}
    assert not gpu_budget.targets({**row, "max_param_diff": 1e-7})["met"]
    assert not gpu_budget.targets({**row, "final_plan_from_step": 0})["met"]  # the first step is over
    assert gpu_budget.targets({"error": "x"}) == {}


def test_junit_outcomes_are_read_per_test(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="t" name="a" time="0.5"/>'
                   '<testcase classname="t" name="b"><skipped message="needs a CUDA device"/></testcase>'
                   '<testcase classname="t" name="c"><failure message="assert 1 == 2&#10;more"/></testcase>'
                   '</testsuite></testsuites>')
    assert gpu_pytest.parse_junit(str(xml)) == [
        {"test": "t::a", "outcome": "passed", "time_s": 0.5},
        {"test": "t::b", "outcome": "skipped", "time_s": 0.0, "why": "needs a CUDA device"},
        {"test": "t::c", "outcome": "failed", "time_s": 0.0, "why": "assert 1 == 2"}]


@pytest.mark.parametrize("args", [[], ["--dry-run"], ["OUT", "nonsense"], ["--dry-run", "OUT", "exec_overhead"],
                                  ["--dry-run", "OUT", "session"]])
def test_bad_arguments_fail_in_one_line(args, tmp_path):
    done = subprocess.run(["bash", str(BENCH / "gpu_run.sh"), *args], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("gpu_run.sh: error:") and not (tmp_path / "OUT").exists()


@pytest.mark.slow
def test_the_dry_run_runs_every_row_within_budget_bit_identical(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(["bash", "benchmarks/gpu_run.sh", "--dry-run", str(tmp_path), "gpu_sanitizer", "gpu_pytest",
                           "gpu_budget"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    sanitized = {r["case"]: r for r in map(json.loads, (tmp_path / "gpu_sanitizer.jsonl").read_text().splitlines())}
    assert sanitized["eager"].get("error") is None and sanitized["eager"]["max_param_diff"] == 0.0  # CUDA's rules kept
    assert sanitized["captured"].get("error") is None and sanitized["captured"]["captured"]  # on the CPU stand-in
    assert sanitized["eager"]["moved"] > 0 and sanitized["captured"]["moved"] > 0
    records = [json.loads(line) for line in (tmp_path / "gpu_budget.jsonl").read_text().splitlines()]
    # a row's key: the dry run gives the searches shorter limits and the model conv source for cudnn
    rows = {(r["group"], r["case"], r["planner"], (r.get("params") or {}).get("policy")): r
            for r in records if r.get("case") not in ("env", "group")}
    assert len(rows) == len(records) - len(gpu_budget.GROUPS) == len(_rows())  # one record per row, one env per group
    for group, case, planner, params in _rows():
        r = rows[(group, case, planner, params.get("policy"))]
        if case == "plain under the cap":  # refused before training, naming planners that fit
            assert "more than the memory cap" in r["error"] and "--planner" in r["error"]
            continue
        assert not r.get("error"), (group, planner, r.get("error"))
        assert r["within_budget"] and r["max_param_diff"] == 0.0, (group, planner)
        assert r["executor"]["diverged_steps"] == 0 and r["executor"]["unresolved"] == 0
        assert r["executor"]["swapped_out"] + r["executor"]["recomputed"] > 0, (group, planner)  # the plan acted
        assert r["measured_peak_bytes"] <= r["memory_cap_bytes"]
    assert "| vgg16 | capped | vdnn:conv" in (tmp_path / "gpu_budget.md").read_text()
    tests = json.loads((tmp_path / "gpu_pytest.json").read_text())
    assert tests["exit_code"] == 0 and tests["counts"]["failed"] == tests["counts"]["error"] == 0
    assert tests["counts"]["skipped"] > 0 and tests["device"] == "cpu"  # every GPU test is skipped here


def test_a_case_without_cudnn_or_room_runs_again_as_it_can(tmp_path, monkeypatch):
    """No nvidia-cudnn-frontend: the row says so and runs on the model source; a budget the planner
    cannot fit: it runs at the planner's smallest + 1% under a cap 5% above, where the group's cap binds."""
    answers = ["MemplanError: the cudnn source needs nvidia-cudnn-frontend: pip install nvidia-cudnn-frontend",
               "InfeasibleBudgetError: budget 3.00 GiB is infeasible for planner 'capuchin': the smallest "
               "feasible load is 3.10 GiB (3328599654 bytes)", None]
    calls = []

    def fake_run_case(out, bench, group, rec, deadline, /, retry_on=None, **kw):
        calls.append((rec, kw))
        done = {**rec, "error": answers[len(calls) - 1]}
        if not (retry_on and retry_on.match(done["error"] or "")):
            gpu_budget.emit(out, bench, done)
        return done

    monkeypatch.setattr(gpu_budget, "run_case", fake_run_case)
    args = type("Args", (), {"out": str(tmp_path), "dry_run": False})()
    gib = 2**30
    gpu_budget.run_row(args, "g", "ucudnn", "capuchin+ucudnn:wd", {"source": "cudnn", "workspace": 1}, 4 * gib,
                       3 * gib, 0.0, str(tmp_path), {})
    assert [kw["planner_params"]["source"] for _, kw in calls] == ["cudnn", "model", "model"]
    least = int(3328599654 * 1.01)
    assert [kw["budget"] for _, kw in calls] == [3 * gib, 3 * gib, least]
    assert calls[2][1]["memory_cap"] == int(least * 1.05) < 4 * gib
    rows = gpu_budget.read(str(tmp_path), "gpu_budget")
    assert [r["error"] for r in rows] == [answers[0], None]  # the failed try says why; the last one ran
    assert rows[1]["budget_from"] and rows[1]["source_from"] == answers[0] and rows[1]["params"]["source"] == "model"


def test_a_pool_group_asks_nothing_of_cuda_before_its_run(tmp_path, monkeypatch):
    """The pool allocator replaces PyTorch's only before CUDA starts: a pool group reads its trace and
    runs, and only then asks the device's name."""
    from memplan.tracing.io import write_trace
    from memplan.workflows.workloads import trace_workload

    model, batch, config = gpu_budget.DRY["resnet50"][:3]
    (tmp_path / "traces").mkdir()
    write_trace(trace_workload(model, batch, fake=True, **config), gpu_budget.trace_path(str(tmp_path), "resnet50"))
    order = []
    monkeypatch.setattr(gpu_budget, "device_info", lambda: order.append("device") or {})
    monkeypatch.setattr(gpu_budget, "run_case", lambda out, bench, group, rec, *a, **kw: order.append(rec["planner"])
                        or {})
    args = type("Args", (), {"out": str(tmp_path), "dry_run": True, "deadline_s": 60})()
    gpu_budget.group_main("resnet50-doa-pool", args)
    assert order == ["autoswap:doa+smartpool", "device"]


def test_a_failed_row_names_its_step_and_its_first_error():
    """Issue 51: a GPU error surfaces later "due to a previous error"; a row keeps the first one and the step."""
    gpu_cases = _load("gpu_cases")
    try:
        try:
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")
        except RuntimeError:
            raise RuntimeError("operation failed due to a previous error during capture")
    except RuntimeError as exc:
        exc.memplan_step, exc.memplan_phase = 3, "the capture"
        rec = {"failed_at": gpu_cases.failed_at(exc), "error": gpu_cases.failure(exc)}
    assert gpu_cases.error_of(rec) == (
        "step 3 (the capture): RuntimeError: CUDA error: an illegal memory access was encountered "
        "(then RuntimeError: operation failed due to a previous error during capture)")
    assert gpu_cases.failed_at(ValueError("no room")) == "before the first step"
    assert gpu_cases.failure(ValueError("no room")) == "ValueError: no room"  # a row's error as it was
