"""The data model, units and file formats of the spine."""

import json

import pytest

from memplan.errors import MemplanError, TraceFormatError
from memplan.model import Decision, Plan, read_plan, write_plan
from memplan.testing.synthetic import chain_trace
from memplan.tracing.io import read_trace, write_trace
from memplan.budget import parse_budget
from memplan.units import parse_bytes


def _oracle_peak(trace):
    """Peak load by brute force over every op, independent of Trace.load."""
    return max(sum(s.nbytes for s in trace.storages if s.alloc_op <= i < s.free_op) for i in range(len(trace.ops)))


def test_load_curve_matches_brute_force():
    trace = chain_trace(6, sizes=[10, 20, 30, 40, 50, 60], param_bytes=3)
    assert trace.peak_load_bytes == _oracle_peak(trace)
    assert trace.load[trace.peak_op] == trace.peak_load_bytes


def test_trace_roundtrip(tmp_path):
    trace = chain_trace(5)
    write_trace(trace, tmp_path / "t.jsonl")
    again = read_trace(tmp_path / "t.jsonl")
    assert again == trace
    assert again.digest == trace.digest


@pytest.mark.parametrize("mutate, field", [
    (lambda rec: rec.pop("nbytes"), "nbytes"),
    (lambda rec: rec.update(kind=3), "kind"),
    (lambda rec: rec.update(bogus=1), "bogus"),
])
def test_bad_trace_line_names_line_and_field(tmp_path, mutate, field):
    path = tmp_path / "t.jsonl"
    write_trace(chain_trace(3), path)
    lines = path.read_text().splitlines()
    record = json.loads(lines[2])
    mutate(record)
    lines[2] = json.dumps(record)
    path.write_text("\n".join(lines))
    with pytest.raises(TraceFormatError, match=rf"t.jsonl:3: .*{field}"):
        read_trace(path)


def test_bad_header_is_rejected(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"schema": "other"}\n')
    with pytest.raises(TraceFormatError, match="schema"):
        read_trace(path)


def test_plan_roundtrip(tmp_path):
    plan = Plan(decisions=(Decision(storage=3, action="swap", out_after=2, back_before=9, trigger=7),),
                planner="x", params={"a": 1}, budget_bytes=100)
    write_plan(plan, tmp_path / "p.json")
    assert read_plan(tmp_path / "p.json") == plan


def test_units():
    assert parse_bytes("8GiB") == 8 * 2**30
    assert parse_bytes("1.5MB") == 1_500_000
    assert parse_budget("50%").bytes_for(1000) == 500
    with pytest.raises(MemplanError):
        parse_bytes("eight")
    with pytest.raises(MemplanError):
        parse_budget("-5%")
