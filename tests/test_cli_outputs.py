"""Issue 29, defects 9 to 14: every output means what it says.

One test (or a few) per defect, each failing before its fix: a time limit spent loading, a
JSON error nobody could parse, a figure under the wrong name, a run over its budget without a
word, a meter that triples a step, and text too wide or too raw to read.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memplan.cli import main
from memplan.conv.db import ConvDB, Row
from memplan.conv.kernels import parse_kernel
from memplan.testing.synthetic import chain_trace

from tests.user_errors import json_run, one_line_error, trace_file  # noqa: F401 (trace_file: a fixture)

ROOT = Path(__file__).resolve().parents[1]


# --- 9. pool --plan: one simulation, interpreted ------------------------------------------------------------


def test_the_interpreted_kernel_gives_the_compiled_kernels_residencies():
    from memplan import plan as make_plan
    from memplan.problem import Problem
    from memplan.sim import kernel_loader
    from memplan.sim.program import compile_program, residencies
    from memplan.sim.simulate import Simulator

    trace = chain_trace(12)
    made = make_plan(trace, "60%", planner="autoswap:doa", simulate_result=False)
    cost = Problem.of(trace).cost
    programs = [compile_program(Problem(trace, cost), made, simulator=Simulator(trace, cost, k))
                for k in (kernel_loader.compiled(), kernel_loader.interpreted())]
    assert kernel_loader.interpreted().run_kernel is not kernel_loader.compiled().run_kernel
    assert programs[0].actions == programs[1].actions and programs[0].predicted == programs[1].predicted
    assert residencies(trace, programs[0]) == residencies(trace, programs[1])


def test_pool_with_a_plan_does_not_load_numba(tmp_path, trace_file):
    plan = tmp_path / "p.json"
    assert main(["plan", str(trace_file), "--planner", "autoswap:doa", "--budget", "70%", "-o", str(plan)]) == 0
    probe = ("import sys; from memplan.cli import main; "
             f"rc = main(['pool', {str(trace_file)!r}, '--plan', {str(plan)!r}, '--time-limit', '5']); "
             "print(rc, 'numba' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert done.stdout.splitlines()[-1] == "0 False"


# --- 10. --json errors, names, units ----------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["plan", "{t}", "--planner", "none", "--budget", "abc", "-o", "{d}/p.json"],
                                  ["simulate", "{t}", "--bogus-option"], ["planners", "--decides", "bogus"],
                                  ["info", "{d}/missing.jsonl"]])
def test_a_json_error_is_one_object_on_stdout_too(capsys, tmp_path, trace_file, argv):
    argv = [a.format(t=trace_file, d=tmp_path) for a in argv] + ["--json"]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and json.loads(out) == {"error": err.strip().removeprefix("memplan: error: ")}


def test_conv_db_show_takes_a_kind_of_source(capsys, tmp_path):
    db = tmp_path / "c.sqlite"
    kernel = parse_kernel("fwd n2 c3x8x8 k4 3x3 p1 s1")
    with ConvDB(db) as conv:
        conv.put([Row(kernel=kernel, algo="pytorch", source="cpu:Some CPU (2 threads)", time_s=1e-3,
                      workspace_bytes=None),
                  Row(kernel=kernel, algo="fft", source="model:v100", time_s=2e-3, workspace_bytes=0)])
    rc, shown = json_run(capsys, ["conv-db", "show", db, "--source", "cpu", "--json"])
    assert [s["source"] for s in shown["sources"]] == ["cpu:Some CPU (2 threads)"]
    rc, rows = json_run(capsys, ["conv-db", "show", db, "--source", "cpu", "--kernel", kernel.describe(), "--json"])
    assert [r["algo"] for r in rows["rows"]] == ["pytorch"]


def test_a_fractional_byte_budget_points_at_percent(capsys, tmp_path, trace_file):
    line = one_line_error(capsys, ["plan", trace_file, "--planner", "none", "--budget", "0.5",
                                   "-o", tmp_path / "p.json"])
    assert "50%" in line and "must be positive" not in line


def test_fit_refuses_an_empty_planner_list(capsys):
    assert "no planner" in one_line_error(capsys, ["fit", "resnet18-cifar", "--world-size", "2", "--planners", ""])


def test_a_batch_at_the_limit_is_not_called_the_maximum(capsys, monkeypatch):
    from memplan.workflows import maxbatch

    monkeypatch.setattr(maxbatch, "_planned_probe", lambda *a: lambda b: (True, {}))
    rc, out = json_run(capsys, ["maxbatch", "resnet18-cifar", "--memory", "1GiB", "--limit", "8", "--json"])
    assert rc == 0 and out["max_batch"] == 8 and out["at_limit"] is True
    assert main(["maxbatch", "resnet18-cifar", "--memory", "1GiB", "--limit", "8"]) == 0
    assert "max batch at least 8" in capsys.readouterr().out


# --- 11. run's figures say what they are ----------------------------------------------------------------

TINY_RUN = ["run", "transformer-encoder", "--batch", "2", "--config", "seq_len=8", "num_layers=1", "d_model=32",
            "nhead=2", "vocab_size=64"]


def test_run_json_says_which_budget_the_prediction_used(capsys):
    rc, out = json_run(capsys, [*TINY_RUN, "--planner", "dtr", "--budget", "100%", "--steps", "1", "--json"])
    assert rc == 0 and out["budget_bytes"] is not None
    assert out["predicted"]["budget_source"] == "plan" and out["predicted"]["budget_bytes"] == out["budget_bytes"]
    assert out["simulated_peak_bytes"] == out["executor"]["simulated_peak_bytes"]


def test_a_pytorch_tool_reports_no_executor_figures(capsys):
    rc, out = json_run(capsys, [*TINY_RUN, "--baseline", "save-on-cpu", "--steps", "1", "--json"])
    assert rc == 0 and out["executor"] is None and out["simulated_peak_bytes"] is None


def test_one_metered_step_is_not_called_a_median_after_the_first(capsys):
    assert main([*TINY_RUN, "--steps", "1"]) == 0
    text = capsys.readouterr().out
    assert "after the first" not in text and "the only metered step" in text
    assert not re.search(r"\d\.\d{7,}", text)  # no raw floats


# --- 12 and 13. a step over its budget says so; the meter costs one step by default ---------------------


def _readme_loop() -> str:
    """The executor page's example (the README's until the docs site held it)."""
    readme = (ROOT / "docs" / "executor.md").read_text()
    block = readme
    return block[block.index("```python") + len("```python"):block.index("```\n", block.index("```python") + 9)]


def test_the_readme_loop_keeps_its_budget_at_every_step(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = _readme_loop().replace("model=model) as run:", "model=model, measure=True) as run:")
    assert "measure=True" in code
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    stats = scope["run"].stats()
    assert len(stats["steps_measured"]) == 2 and stats["over_budget_steps"] == []
    assert all(s["measured_peak_bytes"] <= stats["budget_bytes"] for s in stats["steps_measured"])


def _tiny_step():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return model, step, (torch.randn(256, 64), torch.randint(0, 4, (256,)))


def test_a_step_over_its_budget_warns_and_is_listed(caplog):
    import torch

    import memplan

    model, step, (x, y) = _tiny_step()
    kept = [(torch.randn(256, 64), y) for _ in range(2)]  # batches the trace never saw, all alive
    with caplog.at_level("WARNING", logger="memplan.exec.runtime"), \
            memplan.optimize(step, x, y, budget="100%", model=model, measure=True) as run:
        for batch in kept:
            step(*batch)
    stats = run.stats()
    over = [s["step"] for s in stats["steps_measured"] if s["measured_peak_bytes"] > stats["budget_bytes"] * 1.02]
    assert over and stats["over_budget_steps"] == over
    assert sum("above its budget" in r.getMessage() for r in caplog.records) == len(over)


@pytest.mark.parametrize("measure, measured", [("first", 1), (True, 3), (False, 0)])
def test_which_steps_are_measured(measure, measured):
    import memplan

    model, step, inputs = _tiny_step()
    planned = memplan.optimize(step, *inputs, budget="100%", model=model, measure=measure)
    for _ in range(3):
        planned(*inputs)
    stats = planned.stats()
    planned.close()
    assert len(stats["steps_measured"]) == measured and [s["step"] for s in stats["steps_measured"]] == \
        list(range(measured))


def test_the_default_is_to_measure_the_first_step_only():
    import memplan
    from memplan.errors import MemplanError

    assert memplan.RunOptions().measure == "first"  # optimize takes its run options as one value
    model, step, inputs = _tiny_step()
    with pytest.raises(MemplanError, match="measure"):
        memplan.optimize(step, *inputs, model=model, measure="sometimes")


# --- 14. text output readable ----------------------------------------------------------------------------


def test_planners_fit_the_text_width(capsys):
    from memplan.commands.output import TEXT_COLUMNS

    assert main(["planners"]) == 0
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= TEXT_COLUMNS


def test_a_planner_report_is_in_words_and_units(capsys, tmp_path, trace_file):
    assert main(["plan", str(trace_file), "--planner", "milp", "--budget", "80%", "--time-limit", "5",
                 "-o", str(tmp_path / "p.json")]) == 0
    report = [line for line in capsys.readouterr().out.splitlines() if line.startswith("planner: ")]
    assert report and not [line for line in report if "_" in line.split("  ")[0] or "None" in line]


def test_pool_names_each_figure_once(capsys, tmp_path, trace_file):
    assert main(["pool", str(trace_file), "--time-limit", "2", "--plot", str(tmp_path / "p.png")]) == 0
    names = [line.split("  ")[0] for line in capsys.readouterr().out.splitlines() if not line.startswith(" ")]
    assert len(names) == len(set(names)) and "plot written to" in names


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_a_plot_says_where_it_was_written(capsys, tmp_path, trace_file, command):
    plot = tmp_path / "plot.svg"
    extra = ["--planner", "sqrt-n", "--budgets", "100%"] if command == "sweep" else []
    assert main([command, str(trace_file), *extra, "--plot", str(plot)]) == 0
    assert str(plot) in capsys.readouterr().out and plot.exists()


def test_the_allocator_meter_keeps_the_profilers_lines_off_stderr(capfd):
    import torch

    from memplan.exec.meter import AllocatorMeter

    with AllocatorMeter():
        torch.ones(64) + 1
    assert "profiler" not in capfd.readouterr().err


def test_a_table_is_as_wide_as_its_cells(capsys):
    from memplan.commands.output import print_table

    print_table(("model", "planner", "overhead"), [("m", "a-planner-name-longer-than-any-column", "1.0%"),
                                                   ("resnet18-cifar", "none", "12.5%")], left=2)
    lines = capsys.readouterr().out.splitlines()
    ends = {len(line) for line in lines}  # right-aligned last column: every row ends at one place
    starts = {line.index(cell) for line, cell in zip(lines, ("planner", "a-planner", "none"))}
    assert len(ends) == 1 and len(starts) == 1
