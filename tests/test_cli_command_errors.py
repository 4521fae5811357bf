"""Issue 29, defects 1 to 8: every user mistake is one line (round 2).

One test (or a few) per defect, each failing before its fix: a traceback, a silent
acceptance, a folder made that nobody asked for, or an output that is not what its name says.
Defects 9 to 14 are in tests/test_cli_outputs.py.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from memplan.cli import main
from memplan.model import read_plan
from memplan.tracing.formats import load_any

from tests.user_errors import files_under, json_run, one_line_error, trace_file  # noqa: F401 (trace_file: a fixture)

GPT2 = ["n_layer=1", "vocab_size=64"]  # a small GPT-2: the options reach transformers' own checks fast


# --- 1. a model's own validation of --config is one line naming the model and the option ------------


@pytest.mark.parametrize("model, config, needle", [
    ("hf:gpt2", ["n_embd=63", "n_head=2"], "divisible"),
    ("hf:bert-base", ["hidden_size=65", "num_attention_heads=2", "num_hidden_layers=1", "vocab_size=64"],
     "not a multiple"),
    ("hf:gpt2", ["activation_function=bogus"], "KeyError"),
    ("transformer-encoder", ["d_model=63", "nhead=2", "num_layers=1"], "divisible"),
])
def test_a_config_the_model_refuses_is_one_line(capsys, tmp_path, model, config, needle):
    config = config + (GPT2 if model == "hf:gpt2" else [])
    line = one_line_error(capsys, ["trace", model, "--batch", "1", "--config", *config, "-o", tmp_path / "t.jsonl"])
    assert line.startswith(f"model {model} with config ") and needle in line
    assert all(option in line for option in config)
    assert not (tmp_path / "t.jsonl").exists()


@pytest.fixture
def user_models(tmp_path, monkeypatch):
    """A module of the user's own models: one that cannot be built, one whose step fails."""
    (tmp_path / "mymodels.py").write_text(
        "import torch\n\n"
        "def unbuildable(batch, width=4):\n"
        "    raise ValueError(f'width {width} is not supported')\n\n"
        "def failing_step(batch, width=4):\n"
        "    model = torch.nn.Linear(width, 2)\n"
        "    def step(x):\n"
        "        return model(x[:, :width + 1]).sum().backward()  # a shape the model does not take\n"
        "    return step, (torch.randn(batch, width + 1),)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mymodels", raising=False)
    return tmp_path


@pytest.mark.parametrize("function, needle", [("unbuildable", "cannot be built: ValueError: width 3"),
                                              ("failing_step", "its training step failed: RuntimeError")])
@pytest.mark.parametrize("mode", ["--fake", "--real"])
def test_a_users_model_that_fails_is_one_line(capsys, user_models, function, needle, mode):
    line = one_line_error(capsys, ["trace", f"mymodels:{function}", "--batch", "2", mode, "--config", "width=3",
                                   "-o", user_models / "t.jsonl"])
    assert line.startswith(f"model mymodels:{function} with config width=3:") and needle in line


# --- 2. a sequence longer than the model's positions -------------------------------------------------


@pytest.mark.parametrize("argv", [["trace", "hf:gpt2", "--batch", "1", "--fake"],
                                  ["trace", "hf:gpt2", "--batch", "1", "--real"],
                                  ["run", "hf:gpt2", "--batch", "1", "--steps", "1"]])
def test_a_sequence_longer_than_the_positions_is_refused(capsys, tmp_path, argv):
    out = ["-o", tmp_path / "t.jsonl"] if argv[0] == "trace" else []
    line = one_line_error(capsys, [*argv, "--config", "seq_len=2000", *GPT2, *out])
    assert "seq_len=2000" in line and "1024 positions" in line and "n_positions" in line


def test_a_sequence_within_raised_positions_traces(tmp_path):
    assert main(["trace", "hf:gpt2", "--batch", "1", "--config", "seq_len=2000", "n_positions=2048", *GPT2,
                 "-o", str(tmp_path / "t.jsonl")]) == 0


# --- 3. compare checks everything before any work ----------------------------------------------------


@pytest.mark.parametrize("option, value", [("--models", "bogus"), ("--budgets", "abc"), ("--profile", "bogus"),
                                           ("--run-profile", "bogus"), ("--planners", "bogus"),
                                           ("--baselines", "bogus"), ("--models", ""), ("--budgets", ",")])
def test_compare_refuses_a_bad_option_before_any_work(capsys, tmp_path, option, value):
    out = tmp_path / "report"
    line = one_line_error(capsys, ["compare", "--out", out, f"{option}={value}"])
    assert value.strip(",") in line or "at least one" in line
    assert not out.exists()  # not made, and nothing calibrated into it


@pytest.mark.parametrize("where", ["a file", pytest.param("read-only", marks=pytest.mark.skipif(
    os.geteuid() == 0, reason="root writes everywhere")), "missing parent"])
def test_compare_out_must_be_a_folder_it_can_write(capsys, tmp_path, where):
    out = {"a file": tmp_path / "report", "read-only": tmp_path / "locked" / "report",
           "missing parent": tmp_path / "no" / "report"}[where]
    if where == "a file":
        out.write_text("not a folder")
    (tmp_path / "locked").mkdir(mode=stat.S_IRUSR | stat.S_IXUSR)
    try:
        assert one_line_error(capsys, ["compare", "--out", out, "--models", "resnet18-cifar"])
    finally:
        (tmp_path / "locked").chmod(stat.S_IRWXU)
    assert not (tmp_path / "no").exists()


# --- 4. dqn train --------------------------------------------------------------------------------------


def test_dqn_train_refuses_a_trace_without_ops(capsys, tmp_path):
    csv = tmp_path / "p.csv"
    csv.write_text("id,lower,upper,size\na,0,4,10\nb,1,3,5\n")
    line = one_line_error(capsys, ["dqn", "train", csv, "-o", tmp_path / "w.json"])
    assert "has none" in line and "pool" in line
    assert not (tmp_path / "w.json").exists()


@pytest.mark.slow
def test_dqn_train_defaults_to_budgets_it_can_learn_at(capsys, tmp_path):
    trace = tmp_path / "r8.jsonl"
    assert main(["trace", "resnet18-cifar", "--batch", "8", "-o", str(trace)]) == 0
    capsys.readouterr()
    # The old default: 60% is below the lowest load the agent can reach on this trace.
    assert "infeasible" in one_line_error(capsys, ["dqn", "train", trace, "--budgets", "80%,60%", "--episodes", "1",
                                                   "-o", tmp_path / "w.json"])
    rc, out = json_run(capsys, ["dqn", "train", trace, "--episodes", "1", "-o", tmp_path / "w.json", "--json"])
    peak = load_any(trace).peak_load_bytes
    assert rc == 0 and len(out["problems"]) == 2
    assert all(0 < p["budget_bytes"] < peak and p["best_overhead"] is not None for p in out["problems"])


# --- 5. a plan records the profile it was planned for ----------------------------------------------------


def test_simulate_uses_the_profile_the_plan_was_made_for(capsys, tmp_path, trace_file):
    plan = tmp_path / "p.json"
    rc, planned = json_run(capsys, ["plan", trace_file, "--planner", "sqrt-n", "--budget", "90%",
                                     "--profile", "gtx1080ti", "-o", plan, "--json"])
    assert rc == 0 and read_plan(plan).profile["name"] == "gtx1080ti"
    rc, simulated = json_run(capsys, ["simulate", trace_file, "--plan", plan, "--json"])
    assert simulated["profile"] == "gtx1080ti" and simulated["profile_source"] == "plan"
    assert simulated["time_s"] == planned["predicted"]["time_s"]
    rc, other = json_run(capsys, ["simulate", trace_file, "--plan", plan, "--profile", "h100", "--json"])
    assert other["profile_source"] == "given" and other["time_s"] < simulated["time_s"]


def test_a_damaged_profile_in_a_plan_is_one_line(capsys, tmp_path, trace_file):
    plan = tmp_path / "p.json"
    assert main(["plan", str(trace_file), "--planner", "none", "--budget", "100%", "-o", str(plan)]) == 0
    data = json.loads(plan.read_text())
    data["profile"]["fp32_flops"] = -1
    plan.write_text(json.dumps(data))
    assert "fp32_flops" in one_line_error(capsys, ["simulate", trace_file, "--plan", plan])


# --- 6. no folder is ever made for an output ------------------------------------------------------------


@pytest.mark.parametrize("make_argv", [
    lambda t, d: ["plan", t, "--planner", "none", "--budget", "100%", "-o", d / "p.json"],
    lambda t, d: ["plan", t, "--planner", "ucudnn:wd", "--budget", "100%", "--param", f"db={d / 'x.sqlite'}",
                  "-o", t.parent / "p.json"],
    lambda t, d: ["info", t, "--plot", d / "load.png"],
    lambda t, d: ["conv-db", "fill", d / "c.sqlite", "--kernel", "fwd n2 c3x8x8 k4 3x3 p1 s1"],
])
def test_a_missing_folder_is_refused_not_made(capsys, tmp_path, trace_file, make_argv):
    missing = tmp_path / "no" / "such" / "dir"
    assert "does not exist" in one_line_error(capsys, make_argv(trace_file, missing))
    assert not (tmp_path / "no").exists()


# --- 7. plan files, conv kernels and databases -----------------------------------------------------------


@pytest.mark.parametrize("field, value", [("budget_bytes", -5), ("budget_bytes", 0), ("pool_bytes", -1),
                                          ("planning_s", -1.0)])
def test_a_plan_with_an_impossible_size_is_refused(capsys, tmp_path, trace_file, field, value):
    plan = tmp_path / "p.json"
    assert main(["plan", str(trace_file), "--planner", "sqrt-n", "--budget", "90%", "-o", str(plan)]) == 0
    data = json.loads(plan.read_text())
    data[field] = value
    plan.write_text(json.dumps(data))
    assert field in one_line_error(capsys, ["simulate", trace_file, "--plan", plan])


@pytest.mark.parametrize("spec, needle", [("fwd n0 c3x8x8 k4 3x3 p1 s1", "n must be at least 1"),
                                          ("fwd n2 c0x8x8 k4 3x3 p1 s1", "c must be at least 1"),
                                          ("fwd n2 c3x1x1 k4 5x5 p0 s1", "no output"),
                                          ("fwd n2 c3x8x8 k4 3x3 p1 s1 g2", "groups")])
def test_a_kernel_of_nothing_is_refused_and_makes_no_database(capsys, tmp_path, recwarn, spec, needle):
    db = tmp_path / "c.sqlite"
    assert needle in one_line_error(capsys, ["conv-db", "fill", db, "--kernel", spec])
    assert not db.exists() and not [w for w in recwarn if "divide" in str(w.message)]


def test_a_failed_import_into_a_new_database_leaves_no_file(capsys, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("x,y\n1,2\n")
    assert one_line_error(capsys, ["conv-db", "import", tmp_path / "c.sqlite", bad])
    assert files_under(tmp_path) == {"bad.csv"}


def test_an_interrupted_first_fill_leaves_no_file(capsys, tmp_path, monkeypatch):
    from memplan.conv import sources

    def interrupted(self, kernels):
        raise KeyboardInterrupt

    monkeypatch.setattr(sources.ModelSource, "measure", interrupted)
    assert main(["conv-db", "fill", str(tmp_path / "c.sqlite"), "--kernel", "fwd n2 c3x8x8 k4 3x3 p1 s1"]) == 130
    assert files_under(tmp_path) == set()


# --- 8. info: plots as named, the per-op table, a closed pipe --------------------------------------------


@pytest.mark.parametrize("name, magic", [("load.pdf", b"%PDF"), ("load.svg", b"<?xml"), ("load.png", b"\x89PNG")])
def test_a_plot_is_written_in_the_format_its_name_says(tmp_path, trace_file, name, magic):
    assert main(["info", str(trace_file), "--plot", str(tmp_path / name)]) == 0
    assert (tmp_path / name).read_bytes().startswith(magic)


@pytest.mark.parametrize("argv", [["info", "{t}", "--plot", "{d}/load.jpg"], ["plan", "{t}", "--planner", "none",
                                  "--budget", "100%", "-o", "{d}/plan.txt"], ["trace", "resnet18-cifar", "--batch",
                                  "1", "-o", "{d}/t.json"]])
def test_an_output_named_as_another_format_is_refused(capsys, tmp_path, trace_file, argv):
    argv = [a.format(t=trace_file, d=tmp_path) for a in argv]
    assert "name ends in" in one_line_error(capsys, argv)


def test_info_per_op_prints_the_load_at_every_op(capsys, trace_file):
    from memplan.units import format_bytes

    assert main(["info", str(trace_file), "--per-op"]) == 0
    trace = load_any(trace_file)
    table = capsys.readouterr().out.split("\n\n", 1)[1].splitlines()[1:]
    assert len(table) == len(trace.ops)
    for line, op, load in zip(table, trace.ops, trace.load.tolist()):
        assert line.split()[0] == str(op.index) and format_bytes(load) in line and op.name in line


def test_a_closed_pipe_ends_quietly(tmp_path, trace_file):
    proc = subprocess.Popen([sys.executable, "-m", "memplan", "info", str(trace_file), "--per-op"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    proc.stdout.close()  # the reader is gone before memplan writes its first line
    err = proc.stderr.read().decode()
    assert proc.wait() == 141 and err == ""
