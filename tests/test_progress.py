"""Issue 11, defect 9: searches show progress (trials done, best so far) on a terminal."""

from __future__ import annotations

import sys

import pytest

import memplan
from memplan import pool, progress
from memplan.testing.synthetic import chain_trace
from memplan.workflows import maxbatch


@pytest.fixture
def terminal(monkeypatch, capsys):
    """stderr as a terminal, every bar drawn at once and at every step (the delays are for people).

    Returns a function giving what was drawn; call the fixture's setup inside the test
    body's capture: stderr is pytest's capture stream there, made to look like a terminal.
    """
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(progress, "REDRAW_S", 0.0)

    def drawn() -> str:
        return capsys.readouterr().err

    def as_terminal():
        monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
        return drawn

    return as_terminal


def test_bayesian_optimisation_shows_trials_and_the_best(terminal):
    drawn = terminal()
    memplan.plan(chain_trace(6), "60%", planner="autoswap:bo", n_trials=6, simulate_result=False)
    shown = drawn()
    assert "autoswap:bo" in shown and "6/6" in shown and "best overhead" in shown


def test_pool_search_shows_its_time_limit(terminal):
    drawn = terminal()
    pool.layout(chain_trace(6), allocator="smartpool", time_limit_s=0.5)
    shown = drawn()
    assert "pool smartpool" in shown and "of 0.5 s" in shown


def test_maxbatch_shows_the_largest_fitting_batch(terminal, monkeypatch):
    drawn = terminal()
    monkeypatch.setattr(maxbatch, "_planned_probe", lambda *a: lambda b: (b <= 5, {}))
    assert maxbatch.max_batch("resnet18-cifar", 2**30, planner="none", limit=64)["max_batch"] == 5
    assert "largest fitting so far 5" in drawn()


def test_nothing_shows_off_a_terminal(capsys):
    memplan.plan(chain_trace(6), "60%", planner="autoswap:bo", n_trials=4, simulate_result=False)
    assert capsys.readouterr().err == ""
