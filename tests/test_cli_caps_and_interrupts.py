"""Issue 37: the last user mistakes a new-user probe found are one line, exit 2, no file left.

Each test failed before its fix: the command accepted the mistake silently (exit 0), or left
an output behind when interrupted.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memplan.cli import INTERRUPTED, main
from memplan import plots
from memplan.pool import plot as pool_plot
from memplan.fileio import atomic_output, written_together

from tests.user_errors import files_under, one_line_error, trace_file  # noqa: F401 (trace_file: a fixture)

CSV = Path(__file__).resolve().parents[1] / "data" / "minimalloc-challenging" / "A.1048576.csv"


def test_a_budget_above_the_memory_cap_is_refused(capsys, tmp_path):
    line = one_line_error(capsys, ["run", "resnet18-cifar", "--batch", "2", "--planner", "sqrt-n",
                                   "--budget", "2GiB", "--memory-cap", "1GiB", "--json"])
    assert line.startswith("--budget 2.00 GiB is more than --memory-cap 1.00 GiB")
    assert files_under(tmp_path) == set()


def test_maxbatch_takes_one_memory_cap(capsys):
    line = one_line_error(capsys, ["maxbatch", "resnet18-cifar", "--memory-cap", "512MiB", "--memory", "256MiB"])
    assert "--memory" in line and "not allowed with" in line and "--memory-cap" in line


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_config_number_must_be_finite(capsys, tmp_path, value):
    line = one_line_error(capsys, ["trace", "resnet18-cifar", "--batch", "1", "--config", f"lr={value}",
                                   "-o", tmp_path / "t.jsonl"])
    assert line == f"model resnet18-cifar: config lr={float(value)!r} must be a finite number"
    assert files_under(tmp_path) == set()


def test_maxbatch_where_not_even_batch_1_fits_says_so(capsys):
    argv = ["maxbatch", "vgg11-cifar", "--memory-cap", "1KiB", "--limit", "4"]
    line = one_line_error(capsys, argv)
    assert line.startswith("no batch of vgg11-cifar fits 1.00 KiB with planner none, not even 1: ")
    assert "smallest feasible load" in line
    assert main(argv + ["--json"]) == 2  # with --json too, the error is the one object on stdout
    assert json.loads(capsys.readouterr().out) == {"error": line}


def _interrupted_plot(result, path, *args, **kwargs):
    """A plot interrupted by Ctrl-C half-way through writing."""
    with atomic_output(path, suffix=".png") as tmp:
        Path(tmp).write_bytes(b"\x89PNG half")
        raise KeyboardInterrupt


def test_pool_interrupted_while_plotting_leaves_no_output(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(pool_plot, "plot_layout", _interrupted_plot)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.csv").write_text("id,offset\nold,0\n")
    for offsets in ("off.csv", "old.csv"):
        rc = main(["pool", CSV, "--allocator", "smartpool", "--time-limit", "5", "--offsets-out", offsets,
                   "--plot", "p.png"])
        assert rc == INTERRUPTED and capsys.readouterr().err == "memplan: interrupted\n"
        assert files_under(tmp_path) == {"old.csv"}  # no new file, no temporary one
        assert (tmp_path / "old.csv").read_text() == "id,offset\nold,0\n"  # the file it would replace is unchanged


def test_pool_writes_both_outputs_when_nothing_interrupts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["pool", CSV, "--allocator", "smartpool-bestfit", "--offsets-out", "off.csv", "--plot", "p.png"]) == 0
    assert files_under(tmp_path) == {"off.csv", "p.png"}
    assert len((tmp_path / "off.csv").read_text().splitlines()) == len(CSV.read_text().splitlines())  # a header, a row each


def test_plan_interrupted_while_plotting_writes_no_plan(capsys, tmp_path, monkeypatch, trace_file):
    monkeypatch.setattr(plots, "plot_history", lambda title, history, path: _interrupted_plot(None, path))
    rc = main(["plan", trace_file, "--planner", "home:fast", "--budget", "80%", "--time-limit", "1",
               "-o", tmp_path / "plan.json", "--plot", tmp_path / "conv.png"])
    assert rc == INTERRUPTED
    assert files_under(tmp_path) == {trace_file.name}


def test_outputs_written_together_appear_together(tmp_path):
    with written_together():
        for name in ("a.json", "b.json"):
            with atomic_output(tmp_path / name) as tmp:
                Path(tmp).write_text(name)
        assert not (tmp_path / "a.json").exists()  # staged until the block completes
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"a.json": "a.json", "b.json": "b.json"}
    with pytest.raises(ValueError), written_together():
        with atomic_output(tmp_path / "c.json") as tmp:
            Path(tmp).write_text("c")
        raise ValueError("a later step fails")
    assert files_under(tmp_path) == {"a.json", "b.json"}
