"""Issue 11, defects 7 and 8: every user mistake is one line on stderr and exit code 2.

Each test names the mistake a new user made; before the fix each one was a traceback, a
silent acceptance, or a misleading message.
"""

from __future__ import annotations

import os
import stat

import pytest
import torch

import memplan
from memplan.cli import build_parser, main
from memplan.errors import MemplanError
from memplan.model import read_plan
from memplan.testing.synthetic import chain_trace
from memplan.tracing.io import write_trace

from tests.user_errors import files_under, one_line_error


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(chain_trace(6), path)
    return path


@pytest.mark.parametrize("budget", ["nan%", "inf%", "99999999999999999999999TiB", "-5%", "0.0000000001%", "abc"])
def test_bad_budgets(capsys, tmp_path, trace_file, budget):
    line = one_line_error(capsys, ["plan", trace_file, "--planner", "sqrt-n", f"--budget={budget}",
                                   "-o", tmp_path / "p.json"])
    assert budget in line
    assert one_line_error(capsys, ["simulate", trace_file, f"--budget={budget}"])
    assert not (tmp_path / "p.json").exists()


def test_a_budget_above_the_peak_is_accepted_and_said_so(capsys, tmp_path, trace_file):
    peak = chain_trace(6).peak_load_bytes
    assert main(["plan", str(trace_file), "--planner", "none", "--budget", "150%", "-o", str(tmp_path / "p.json")]) == 0
    assert "150% of the unconstrained peak" in capsys.readouterr().out
    assert read_plan(tmp_path / "p.json").budget_bytes == int(peak * 1.5)


@pytest.mark.parametrize("device", ["bogus", "cuda:99"])
@pytest.mark.parametrize("command", [["trace", "resnet18-cifar", "--batch", "2", "-o", "x.jsonl"],
                                     ["run", "resnet18-cifar", "--batch", "2"],
                                     ["maxbatch", "resnet18-cifar", "--memory", "1GiB"]])
def test_bad_torch_device(capsys, tmp_path, command, device):
    line = one_line_error(capsys, [*command, "--device", device])
    assert device in line and "--device" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA")
def test_cuda_without_a_gpu(capsys):
    assert "no CUDA device" in one_line_error(capsys, ["run", "resnet18-cifar", "--batch", "2", "--device", "cuda"])


@pytest.mark.parametrize("argv, needle", [
    (["run", "resnet18-cifar", "--batch", "2", "--steps", "0"], "--steps"),
    (["run", "resnet18-cifar", "--batch", "2", "--steps", "-2"], "--steps"),
    (["run", "resnet18-cifar", "--batch", "0"], "--batch"),
    (["maxbatch", "resnet18-cifar", "--memory", "1GiB", "--limit", "-5"], "--limit"),
    (["trace", "resnet18-cifar", "--batch", "2", "--warmup", "-1", "-o", "x.jsonl"], "--warmup"),
    (["trace", "resnet18-cifar", "--batch", "2", "--config", "num_classes=0", "-o", "x.jsonl"], "num_classes"),
    (["trace", "hf:gpt2", "--batch", "1", "--config", "n_layer=-3", "-o", "x.jsonl"], "n_layer"),
    (["pool", "t.csv", "--time-limit", "-1"], "--time-limit"),
    (["sweep", "t.jsonl", "--planner", "autoswap:doa", "--trials", "0"], "--trials"),
])
def test_bad_counts_and_sizes(capsys, argv, needle):
    assert needle in one_line_error(capsys, argv)


def test_out_of_memory_says_it_does_not_fit(capsys):
    line = one_line_error(capsys, ["run", "resnet18-cifar", "--batch", "1000000000", "--steps", "1"])
    assert "does not fit" in line and "--batch" in line


@pytest.mark.parametrize("option", ["-o", "--plot"])
def test_output_that_is_a_directory(capsys, tmp_path, trace_file, option):
    folder = tmp_path / "adir"
    folder.mkdir()
    argv = {"-o": ["plan", trace_file, "--planner", "none", "--budget", "100%", "-o", folder],
            "--plot": ["pool", trace_file, "--allocator", "smartpool-bestfit", "--plot", folder]}[option]
    before = files_under(tmp_path)
    assert "is a directory" in one_line_error(capsys, argv)
    assert files_under(tmp_path) == before  # no adir.tmp.png or other leftovers


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes everywhere")
def test_unwritable_output(capsys, tmp_path, trace_file):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        line = one_line_error(capsys, ["plan", trace_file, "--planner", "none", "--budget", "100%",
                                       "-o", locked / "p.json"])
    finally:
        locked.chmod(stat.S_IRWXU)
    assert "cannot write" in line


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    from memplan import fileio

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio.os, "replace", broken_replace)
    with pytest.raises(MemplanError, match="No space left"):
        fileio.atomic_write_text(tmp_path / "out.json", "{}")
    assert files_under(tmp_path) == set()


def test_outputs_honour_the_umask(tmp_path, trace_file):
    old = os.umask(0o027)
    try:
        assert main(["plan", str(trace_file), "--planner", "none", "--budget", "100%",
                     "-o", str(tmp_path / "p.json")]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "p.json").stat().st_mode) == 0o640


@pytest.mark.parametrize("param", ["min_bytes=abc", "min_bytes=-5", "n_trials=2.5", "allow_multi_swap=3"])
def test_bad_planner_parameter_values(capsys, tmp_path, trace_file, param):
    line = one_line_error(capsys, ["plan", trace_file, "--planner", "autoswap:doa", "--budget", "70%",
                                   "--param", param, "-o", tmp_path / "p.json"])
    assert param.split("=")[0] in line


@pytest.mark.parametrize("command", sorted(build_parser()._subparsers._group_actions[0].choices))
def test_every_help_page_prints(capsys, command):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: memplan")


def test_baseline_and_planner_together_are_refused(capsys):
    line = one_line_error(capsys, ["run", "resnet18-cifar", "--batch", "2", "--baseline", "save-on-cpu",
                                   "--planner", "sqrt-n"])
    assert "--planner" in line and "--baseline" in line


def test_infeasible_message_suggests_only_options_the_cli_takes(capsys, tmp_path, trace_file):
    line = one_line_error(capsys, ["plan", trace_file, "--planner", "autoswap:doa", "--budget", "1%",
                                   "-o", tmp_path / "p.json"])
    assert "--param allow_multi_swap=true" in line
    assert main(["plan", str(trace_file), "--planner", "autoswap:doa", "--budget", "1%",
                 "--param", "allow_multi_swap=true", "-o", str(tmp_path / "p.json")]) in (0, 2)
    assert "has no parameter" not in capsys.readouterr().err


def test_load_min_says_when_there_are_no_candidates(capsys, tmp_path, trace_file):
    line = one_line_error(capsys, ["plan", trace_file, "--planner", "autoswap:doa", "--budget", "90%",
                                   "--param", f"min_bytes={2**40}", "-o", tmp_path / "p.json"])
    assert "no candidates at all" in line


def test_float_budget_is_a_share():
    tr = chain_trace(6)
    assert memplan.plan(tr, 0.9, planner="sqrt-n").budget_bytes == int(tr.peak_load_bytes * 0.9)
    for bad in (1.5, 0.0, float("nan"), True):
        with pytest.raises(MemplanError, match="budget|byte size"):
            memplan.plan(tr, bad, planner="sqrt-n")


@pytest.mark.parametrize("call", ["plan", "simulate", "validate"])
def test_a_file_name_instead_of_a_trace(call, trace_file):
    args = (str(trace_file),) if call != "validate" else (str(trace_file), memplan.Plan())
    with pytest.raises(MemplanError, match="load_any"):
        getattr(memplan, call)(*args)


@pytest.mark.parametrize("content, needle", [
    ("id,lower,size\na,0,4\n", "expected the header"),
    ("id,lower,upper,size\na,0,4,1\na,1,3,2\n", "'a' is already used on line 2"),
])
def test_bad_minimalloc_csv(capsys, tmp_path, content, needle):
    path = tmp_path / "p.csv"
    path.write_text(content)
    for command in (["info", path], ["pool", path]):
        assert needle in one_line_error(capsys, command)


def test_a_trace_cut_at_a_line_boundary(capsys, tmp_path, trace_file):
    lines = trace_file.read_text().splitlines()
    for keep in (1, len(lines) // 2, len(lines) - 1):
        cut = tmp_path / f"cut{keep}.jsonl"
        cut.write_text("\n".join(lines[:keep]) + "\n")
        assert "cut short" in one_line_error(capsys, ["info", cut])


def test_a_profile_is_called_a_profile(capsys, tmp_path, trace_file):
    line = one_line_error(capsys, ["plan", trace_file, "--planner", "sqrt-n", "--budget", "90%", "--profile", "nosuch",
                                   "-o", tmp_path / "p.json"])
    assert "unknown profile 'nosuch'" in line and "h100" in line and "memplan calibrate" in line
    with pytest.raises(MemplanError, match="unknown profile 'nosuch'"):
        memplan.plan(chain_trace(6), "90%", planner="sqrt-n", profile="nosuch")


def test_an_option_that_was_renamed_says_what_it_is_called_now(capsys, tmp_path, trace_file):
    line = one_line_error(capsys, ["plan", trace_file, "--planner", "sqrt-n", "--budget", "90%", "--device", "h100",
                                   "-o", tmp_path / "p.json"])
    assert "unrecognized arguments: --device h100" in line and "--device is --profile now" in line
    assert not (tmp_path / "p.json").exists()
