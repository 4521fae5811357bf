"""Issue 11, defects 2 and 3: what a budget bounds, and which budget a simulation uses.

The trace is a chain whose layers compute too little to hide their swaps, so an
uncapped simulation of a swap plan overshoots its budget, and so would a pool laid out
over that uncapped program (the swap-outs hold memory until their copies land).
"""

from __future__ import annotations

import json

import pytest

import memplan
from memplan.budget import NO_LIMIT
from memplan.cli import main
from memplan.errors import InfeasibleBudgetError
from memplan.model import Plan, write_plan
from memplan.pool import layout
from memplan.testing.synthetic import chain_trace
from memplan.tracing.io import write_trace

FAST_LAYERS = 1e9  # FLOPs per layer: microseconds on an H100, far less than a 64 MiB copy


@pytest.fixture(scope="module")
def trace():
    return chain_trace(6, flops_per_layer=FAST_LAYERS)


def test_a_pool_is_laid_out_over_the_program_its_budget_runs(trace):
    """The layout is of the program the executor runs under the plan's budget: there the
    swap-outs release as memory is needed, so the pool fits (laid out over the uncapped
    program, the swap-outs would hold memory until their copies land, past the budget)."""
    budget = int(trace.peak_load_bytes * 0.8)
    pooled = memplan.plan(trace, budget, planner="autoswap:aoa+smartpool", pool_time_limit_s=0.5)
    assert pooled.decisions and pooled.pool_bytes <= budget and memplan.validate(trace, pooled) == []
    uncapped = layout(trace, pooled.with_meta(budget_bytes=NO_LIMIT), time_limit_s=0.5)
    assert uncapped.footprint_bytes > budget


def test_no_budget_means_no_limit_for_a_pool(trace):
    result = memplan.plan(trace, None, planner="smartpool-firstfit")
    assert result.budget_bytes == NO_LIMIT and memplan.validate(trace, result) == []


def test_validate_reports_a_pool_over_the_budget(trace):
    pooled = memplan.plan(trace, "100%", planner="smartpool-bestfit")
    assert memplan.validate(trace, pooled) == []
    wasteful = pooled.with_meta(pool_bytes=pooled.budget_bytes + 4096)  # same slots, a larger block
    assert [v.kind for v in memplan.validate(trace, wasteful)] == ["pool_over_budget"]


def test_simulate_uses_the_plans_budget(trace):
    swaps = memplan.plan(trace, "80%", planner="autoswap:aoa", simulate_result=False)
    own = memplan.simulate(trace, swaps)
    assert (own.budget_bytes, own.budget_source) == (swaps.budget_bytes, "plan")
    assert own.feasible and own.peak_load_bytes <= swaps.budget_bytes
    uncapped = memplan.simulate(trace, swaps, budget="none")
    assert (uncapped.budget_bytes, uncapped.budget_source) == (NO_LIMIT, "none")
    assert uncapped.peak_load_bytes > swaps.budget_bytes  # why the plan's own cap matters
    given = memplan.simulate(trace, swaps, budget="90%")
    assert given.budget_source == "given" and given.budget_bytes == int(trace.peak_load_bytes * 0.9)
    assert memplan.simulate(trace).budget_source == "none"


def test_simulate_cli_says_which_budget(capsys, tmp_path, trace):
    swaps = memplan.plan(trace, "80%", planner="autoswap:aoa", simulate_result=False)
    write_trace(trace, tmp_path / "t.jsonl")
    write_plan(swaps, tmp_path / "p.json")
    base = ["simulate", str(tmp_path / "t.jsonl"), "--plan", str(tmp_path / "p.json"), "--json"]
    for extra, budget, source in (([], swaps.budget_bytes, "plan"), (["--budget", "none"], None, "none"),
                                  (["--budget", "90%"], int(trace.peak_load_bytes * 0.9), "given")):
        assert main(base + extra) == 0
        out = json.loads(capsys.readouterr().out)
        assert (out["budget_bytes"], out["budget_source"]) == (budget, source)
    assert out["peak_load_bytes"] <= budget
    assert main(base[:-1]) == 0
    assert "the plan's own budget" in capsys.readouterr().out


def test_a_plan_without_a_budget_is_simulated_uncapped(trace):
    result = memplan.simulate(trace, Plan(trace_digest=trace.digest))
    assert result.budget_bytes == NO_LIMIT and result.budget_source == "none"
