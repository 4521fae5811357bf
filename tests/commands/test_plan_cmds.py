"""`memplan plan` and `memplan planners` end to end through `memplan.cli.main`."""

import json

import pytest

from memplan.cli import main
from memplan.errors import MemplanError
from memplan.planners import base
from memplan.model import Decision, Plan, read_plan
from memplan.testing.synthetic import chain_trace
from memplan.tracing.io import write_trace


@pytest.fixture()
def trace_file(tmp_path):
    path = tmp_path / "chain9.jsonl"
    write_trace(chain_trace(9), path)
    return path


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_planners_lists_the_baselines(capsys):
    code, out, _ = _run(capsys, "planners", "--json")
    assert code == 0
    listed = {p["name"]: p["summary"] for p in json.loads(out)["planners"]}
    for name in ("none", "save-on-cpu", "checkpoint-all", "sqrt-n"):
        assert listed[name]
    assert json.loads(out)["compose_with"] == {"microbatch": ["ucudnn:wd", "ucudnn:wr"],
                                               "pool": ["smartpool", "smartpool-bestfit", "smartpool-firstfit"]}
    code, out, _ = _run(capsys, "planners")
    assert code == 0 and any(line.startswith("sqrt-n ") for line in out.splitlines())
    assert any(line.startswith("X+Y ") for line in out.splitlines())


def test_plan_writes_a_valid_plan(capsys, trace_file, tmp_path):
    out_path = tmp_path / "plan.json"
    code, out, err = _run(capsys, "plan", trace_file, "--planner", "sqrt-n", "--budget", "90%", "-o", out_path,
                          "--json")
    assert code == 0, err
    summary = json.loads(out)  # exactly one JSON object on stdout
    assert summary["valid"] and summary["recomputes"] == 5 and summary["swaps"] == 0
    written = read_plan(out_path)
    # Hand-derived for a 9-layer chain: 3 segments, storages a0, a1, a3, a4, a6 recomputed.
    names = {chain_trace(9).storages[d.storage].name for d in written.decisions}
    assert names == {"a0", "a1", "a3", "a4", "a6"}
    assert written.planner == "sqrt-n" and written.budget_bytes == int(chain_trace(9).peak_load_bytes * 0.9)


def test_plan_table_output(capsys, trace_file, tmp_path):
    code, out, _ = _run(capsys, "plan", trace_file, "--planner", "save-on-cpu", "--budget", "100%",
                        "-o", tmp_path / "p.json")
    assert code == 0
    assert "planner" in out and "save-on-cpu" in out and "9 swap" in out


def test_plan_param_reaches_the_planner(capsys, trace_file, tmp_path):
    code, out, _ = _run(capsys, "plan", trace_file, "--planner", "sqrt-n", "--budget", "100%",
                        "--param", "segments=9", "-o", tmp_path / "p.json", "--json")
    assert code == 0 and json.loads(out)["decisions"] == 0  # every layer its own segment
    assert read_plan(tmp_path / "p.json").params == {"segments": 9}


@pytest.mark.parametrize("argv, message", [
    (["--planner", "none", "--budget", "50%"], "infeasible"),
    (["--planner", "nope", "--budget", "50%"], "unknown planner"),
    (["--planner", "sqrt-n", "--budget", "50%", "--param", "segments"], "key=value"),
    (["--planner", "sqrt-n", "--budget", "50%", "--param", "bogus=1"], "no parameter"),
    (["--planner", "none", "--budget", "lots"], "not a byte size"),
])
def test_plan_user_errors_exit_2_without_output(capsys, trace_file, tmp_path, argv, message):
    out_path = tmp_path / "plan.json"
    code, out, err = _run(capsys, "plan", trace_file, *argv, "-o", out_path)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err
    assert not out_path.exists()


def test_missing_trace_file(capsys, tmp_path):
    code, _, err = _run(capsys, "plan", tmp_path / "nope.jsonl", "--budget", "1GiB", "-o", tmp_path / "p.json")
    assert code == 2 and "no such file" in err


def _register(monkeypatch, fn, name="broken-test"):
    monkeypatch.setitem(base.PLANNERS.by_name, name, base.PlannerSpec(name, fn, {}, "broken", frozenset({"swap"}), ()))


def test_invalid_plan_is_an_internal_error_and_not_written(capsys, trace_file, tmp_path, monkeypatch):
    def broken(problem):
        trace = problem.trace
        # a0 is read by layer 1 (op 1) while it would be on the host.
        a0 = next(s.id for s in trace.storages if s.name == "a0")
        return Plan(decisions=(Decision(storage=a0, action="swap", out_after=0, back_before=17),))

    _register(monkeypatch, broken)
    out_path = tmp_path / "plan.json"
    code, out, err = _run(capsys, "plan", trace_file, "--planner", "broken-test", "--budget", "100%",
                          "-o", out_path, "--json")
    assert code == 1 and not out_path.exists()
    summary = json.loads(out)
    assert summary["valid"] is False and summary["violations"][0]["kind"] == "read_while_absent"
    assert summary["exception"] is None and summary["internal_error"] in err
    assert len(err.splitlines()) == 1
    assert err.startswith("memplan: error: internal error in planner 'broken-test': it produced an invalid plan")
    assert err.rstrip().endswith("; please report")


def test_an_exception_inside_a_planner_is_an_internal_error(capsys, trace_file, tmp_path, monkeypatch):
    def crashing(problem):
        raise IndexError("index 7 is out of bounds\nfor axis 0")

    _register(monkeypatch, crashing)
    out_path = tmp_path / "plan.json"
    code, out, err = _run(capsys, "plan", trace_file, "--planner", "broken-test", "--budget", "100%",
                          "-o", out_path, "--json")
    assert code == 1 and not out_path.exists()
    assert err == ("memplan: error: internal error in planner 'broken-test': IndexError: index 7 is out of "
                   "bounds for axis 0; please report\n")
    summary = json.loads(out)
    assert summary["valid"] is False and summary["exception"] == "IndexError" and summary["violations"] == []
    assert summary["planner"] == "broken-test" and summary["internal_error"] in err


def test_a_user_mistake_inside_a_planner_stays_exit_2(capsys, trace_file, tmp_path, monkeypatch):
    def refusing(problem):
        raise MemplanError("this planner needs a trace with module names")

    _register(monkeypatch, refusing)
    code, out, err = _run(capsys, "plan", trace_file, "--planner", "broken-test", "--budget", "100%",
                          "-o", tmp_path / "plan.json", "--json")
    assert code == 2 and "internal error" not in err and "module names" in err
    assert json.loads(out) == {"error": err.strip().removeprefix("memplan: error: ")}  # --json: the same line


def test_a_minimalloc_problem_is_planned_by_pool_planners_only(capsys, tmp_path):
    csv = tmp_path / "problem.csv"
    csv.write_text("id,lower,upper,size\na,0,3,100\nb,1,4,200\nc,3,5,300\n")
    code, out, err = _run(capsys, "plan", csv, "--planner", "sqrt-n", "--budget", "100%", "-o", tmp_path / "p.json")
    assert code == 2 and len(err.splitlines()) == 1 and "pool problem" in err and "smartpool" in err
    code, out, err = _run(capsys, "plan", csv, "--planner", "smartpool-bestfit", "--budget", "100%",
                          "-o", tmp_path / "p.json", "--json")
    summary = json.loads(out)
    assert code == 0, err
    assert summary["pool_bytes"] == 500 and summary["predicted"]["peak_load_bytes"] == 500


def test_plan_prints_the_simulated_prediction(capsys, trace_file, tmp_path):
    pytest.importorskip("memplan.sim.simulate")
    code, out, _ = _run(capsys, "plan", trace_file, "--planner", "sqrt-n", "--budget", "90%",
                        "-o", tmp_path / "p.json", "--json")
    predicted = json.loads(out)["predicted"]
    assert code == 0 and predicted["feasible"]
    assert predicted["peak_load_bytes"] <= int(chain_trace(9).peak_load_bytes * 0.9)
    # sqrt-n only recomputes: some time is spent recomputing, and the iteration is slower than baseline.
    assert predicted["breakdown"]["recompute_s"] > 0 and predicted["time_s"] > predicted["baseline_time_s"]


def test_planners_declare_what_they_decide_and_their_typed_parameters(capsys):
    code, out, _ = _run(capsys, "planners", "--decides", "recompute", "--json")
    names = {p["name"]: p for p in json.loads(out)["planners"]}
    assert code == 0 and {"sqrt-n", "checkpoint-all"} <= set(names)
    assert all("recompute" in p["decides"] for p in names.values()) and "autoswap:doa" not in names
    assert names["sqrt-n"]["params"] == {"segments": {"type": "int", "default": None},
                                         "by_blocks": {"type": "bool", "default": True}}


def test_a_parameter_of_the_wrong_type_is_one_clear_error(capsys, trace_file, tmp_path):
    code, _, err = _run(capsys, "plan", trace_file, "--planner", "autoswap:doa", "--budget", "90%",
                        "--param", "min_bytes=abc", "-o", tmp_path / "p.json")
    assert code == 2 and "min_bytes must be int" in err and len(err.strip().splitlines()) == 1
