"""`memplan sweep` and memplan.reports.sweep."""

import json

import pytest

from memplan.cli import main
from memplan.errors import MemplanError
from memplan.budget import parse_budgets
from memplan.testing.synthetic import MIB, chain_trace
from memplan.tracing.io import write_trace
from memplan.reports.sweep import sweep

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _trace():
    return chain_trace(6, sizes=[s * MIB for s in (32, 24, 48, 16, 40, 8)], param_bytes=2 * MIB,
                       flops_per_layer=4e10)


def _oracle_load_min(trace):
    """Peak with every candidate gap away: brute force over ops (1 MiB threshold, gap spans peak or wraps)."""
    n = len(trace.ops)
    load = [sum(s.nbytes for s in trace.storages if s.alloc_op <= t < s.free_op) for t in range(n)]
    peak = load.index(max(load))
    for s in trace.storages:
        acc = sorted({op.index for op in trace.ops if s.id in op.reads or s.id in op.writes})
        if s.nbytes < MIB or not acc:
            continue
        for a, b in zip(acc, acc[1:]):
            if a < peak < b:
                for t in range(a + 1, b):
                    load[t] -= s.nbytes
        if s.persistent:
            for t in list(range(acc[-1] + 1, n)) + list(range(acc[0])):
                load[t] -= s.nbytes
    return max(load)


def test_parse_budgets():
    assert [b.bytes_for(4000) for b in parse_budgets("100%, 50%,1000")] == [4000, 2000, 1000]
    with pytest.raises(MemplanError):
        parse_budgets(" , ")
    with pytest.raises(MemplanError):
        parse_budgets("half")


def test_sweep_json_and_plot(tmp_path, capsys):
    pytest.importorskip("memplan.sim.simulate")
    trace = _trace()
    path = tmp_path / "t.jsonl"
    write_trace(trace, path)
    floor = _oracle_load_min(trace)
    below = floor - MIB
    budgets = f"100%,80%,{floor},{below}"
    rc = main(["sweep", str(path), "--planner", "autoswap:doa", "--planner", "autoswap:wdoa", "--budgets", budgets,
               "--profile", "gtx1080ti", "--json", "--plot", str(tmp_path / "p.png")])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["load_min_bytes"] == floor
    assert len(out["points"]) == 8
    for p in out["points"]:
        assert set(p) >= {"budget_bytes", "peak_load_bytes", "footprint_bytes", "overhead", "planning_s"}
        if p["budget_bytes"] == below:
            assert p["overhead"] is None and "load_min" in p["error"]
        else:
            assert p["overhead"] is not None and p["overhead"] >= 0
            assert p["peak_load_bytes"] <= p["budget_bytes"]
    full = [p for p in out["points"] if p["budget_bytes"] == trace.peak_load_bytes]
    assert all(p["overhead"] == 0 and p["peak_load_bytes"] == trace.peak_load_bytes for p in full)
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG_MAGIC


def test_sweep_table(tmp_path, capsys):
    pytest.importorskip("memplan.sim.simulate")
    path = tmp_path / "t.jsonl"
    write_trace(_trace(), path)
    assert main(["sweep", str(path), "--planner", "autoswap:aoa", "--budgets", "100%,90%"]) == 0
    text = capsys.readouterr().out
    assert "load_min" in text and "autoswap:aoa" in text


@pytest.mark.parametrize("extra, message", [
    (["--planner", "autoswap:nope"], "unknown planner"),
    (["--planner", "autoswap:doa", "--budgets", "lots"], "lots"),
    (["--planner", "autoswap:doa", "--trials", "0"], "--trials"),
])
def test_sweep_bad_input_exits_2(tmp_path, capsys, extra, message):
    path = tmp_path / "t.jsonl"
    write_trace(_trace(), path)
    assert main(["sweep", str(path), *extra]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def test_milp_never_gets_slower_as_the_budget_grows():
    """In a sweep the reference planners keep their plan of a tighter budget where it is faster (issue 39:
    milp under a time limit returned 368.8% at 70% and 31.7% at 40%): their overhead never rises
    with the budget, whatever each solve found in time."""
    trace = chain_trace(9, sizes=[(16 + 24 * (i % 4)) * MIB for i in range(9)])
    result = sweep(trace, ["milp"], ["90%", "70%", "50%", "60%"], params={"milp": {"time_limit_s": 2.0}})
    by_budget = sorted((p.budget_bytes, p.overhead) for p in result.points)
    overheads = [o for _, o in by_budget if o is not None]
    assert len(overheads) >= 3 and overheads == sorted(overheads, reverse=True)
    assert [p.budget_bytes for p in result.points] == [int(s * trace.peak_load_bytes) for s in (0.9, 0.7, 0.5, 0.6)]
