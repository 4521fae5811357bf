"""Issue 11, defect 6: one check at load that a plan belongs to its trace, used everywhere."""

from __future__ import annotations

import json

import pytest

import memplan
from memplan import pool
from memplan.errors import MemplanError
from memplan.model import Decision, Plan, PoolSlot, read_plan, write_plan
from memplan.testing.synthetic import chain_trace
from memplan.tracing.io import write_trace

from tests.user_errors import one_line_error


@pytest.fixture
def files(tmp_path):
    trace = chain_trace(6)
    write_trace(trace, tmp_path / "t.jsonl")
    return trace, tmp_path / "t.jsonl"


def _foreign(trace) -> Plan:
    other = chain_trace(7)
    return memplan.plan(other, "100%", planner="none", simulate_result=False)


BAD_PLANS = {
    "unknown storage": lambda t: Plan(decisions=(Decision(storage=len(t.storages) + 5, action="swap",
                                                          out_after=1, back_before=3),)),
    "op past the end": lambda t: Plan(decisions=(Decision(storage=1, action="swap", out_after=1,
                                                          back_before=len(t.ops) + 9),)),
    "unknown pool storage": lambda t: Plan(pool=(PoolSlot(storage=999, start=0, offset=0),), pool_bytes=10),
    "another trace": _foreign,
}


@pytest.mark.parametrize("case", sorted(BAD_PLANS))
@pytest.mark.parametrize("command", ["simulate", "pool"])
def test_cli_refuses_in_one_line(capsys, tmp_path, files, case, command):
    trace, path = files
    write_plan(BAD_PLANS[case](trace), tmp_path / "p.json")
    line = one_line_error(capsys, [command, path, "--plan", tmp_path / "p.json"])
    assert "p.json" in line


@pytest.mark.parametrize("case", sorted(BAD_PLANS))
def test_python_api_refuses_alike(files, case):
    trace, _ = files
    plan = BAD_PLANS[case](trace)
    with pytest.raises(MemplanError, match="another trace|names storage|outside the trace"):
        memplan.simulate(trace, plan)
    with pytest.raises(MemplanError, match="another trace|names storage|outside the trace"):
        pool.layout(trace, plan, allocator="smartpool-bestfit")


def test_read_plan_checks_against_the_trace(tmp_path, files):
    trace, _ = files
    write_plan(_foreign(trace), tmp_path / "p.json")
    assert read_plan(tmp_path / "p.json").planner == "none"  # no trace: the file alone is fine
    with pytest.raises(MemplanError, match="another trace"):
        read_plan(tmp_path / "p.json", trace)


def test_validate_still_reports_instead_of_raising(files):
    trace, _ = files
    kinds = {v.kind for v in memplan.validate(trace, BAD_PLANS["unknown storage"](trace))}
    assert kinds == {"unknown_storage"}


@pytest.mark.parametrize("field, value", [("storage", "3"), ("out_after", True), ("trigger", 1.5), ("sync", 1)])
def test_plan_fields_of_the_wrong_type(capsys, tmp_path, files, field, value):
    trace, path = files
    data = Plan(decisions=(Decision(storage=1, action="swap", out_after=1, back_before=3),)).to_json()
    data["decisions"][0][field] = value
    (tmp_path / "p.json").write_text(json.dumps(data))
    assert field in one_line_error(capsys, ["simulate", path, "--plan", tmp_path / "p.json"])
