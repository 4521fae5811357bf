"""`memplan simulate` from the command line."""

import json

from memplan.cli import main
from memplan.model import Decision, Plan, write_plan
from memplan.testing.synthetic import chain_trace
from memplan.tracing.io import write_trace


def _trace_file(tmp_path):
    trace = chain_trace(6)
    path = tmp_path / "t.jsonl"
    write_trace(trace, path)
    return trace, path


def test_json_summary_without_plan_is_the_baseline(tmp_path, capsys):
    trace, path = _trace_file(tmp_path)
    assert main(["simulate", str(path), "--profile", "v100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["time_s"] == out["baseline_time_s"]
    assert out["peak_load_bytes"] == trace.peak_load_bytes
    assert set(out["breakdown"]) >= {"compute_s", "memory_stall_s", "prefetch_stall_s", "recompute_s",
                                     "sync_stall_s", "overlap_s"}


def test_plan_and_plot(tmp_path, capsys):
    trace, path = _trace_file(tmp_path)
    sid = next(s.id for s in trace.storages if s.name == "a1")
    acc = trace.accesses[sid]
    write_plan(Plan(decisions=(Decision(storage=sid, action="recompute", out_after=acc[1], back_before=acc[2]),),
                    trace_digest=trace.digest), tmp_path / "p.json")
    plot = tmp_path / "timeline.png"
    assert main(["simulate", str(path), "--plan", str(tmp_path / "p.json"), "--profile", "v100",
                 "--budget", "95%", "--plot", str(plot), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["feasible"] and out["breakdown"]["recompute_s"] > 0
    assert out["peak_load_bytes"] <= 0.95 * trace.peak_load_bytes
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_for_another_trace_is_refused(tmp_path, capsys):
    _, path = _trace_file(tmp_path)
    write_plan(Plan(trace_digest="0123456789abcdef"), tmp_path / "p.json")
    assert main(["simulate", str(path), "--plan", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another trace" in err


def test_bad_inputs_exit_2(tmp_path, capsys):
    _, path = _trace_file(tmp_path)
    (tmp_path / "bad.json").write_text("{not json")
    for argv in (["simulate", str(tmp_path / "missing.jsonl")],
                 ["simulate", str(path), "--profile", "tpu9"],
                 ["simulate", str(path), "--budget", "lots"],
                 ["simulate", str(path), "--plan", str(tmp_path / "bad.json")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("memplan: error:") and err.count("\n") == 1, err


def test_infeasible_budget_is_reported_not_raised(tmp_path, capsys):
    _, path = _trace_file(tmp_path)
    assert main(["simulate", str(path), "--budget", "10%", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["feasible"] is False and out["infeasible_op"] is not None and out["shortfall_bytes"] > 0
