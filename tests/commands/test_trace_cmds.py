"""`memplan trace` and `memplan info` through memplan.cli.main."""

import json

import pytest

from memplan.cli import main
from memplan.tracing.io import read_trace

SMALL = "tests.tracing.test_tracer:small_workload"  # the repository root is on sys.path under pytest


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "small.jsonl"
    assert main(["trace", SMALL, "--batch", "2", "--real", "-o", str(path), "--json"]) == 0
    return path


def test_trace_json_is_one_object_and_matches_the_file(capsys, tmp_path):
    out_path = tmp_path / "t.jsonl"
    rc, out, _ = _run(capsys, "trace", SMALL, "--batch", "2", "--fake", "--input-size", "4",
                      "-o", str(out_path), "--json")
    assert rc == 0
    summary = json.loads(out)  # exactly one JSON object, nothing else on stdout
    tr = read_trace(out_path)
    assert summary["ops"] == len(tr.ops) and summary["storages"] == len(tr.storages)
    assert summary["peak_load_bytes"] == max(
        sum(s.nbytes for s in tr.storages if s.alloc_op <= i < s.free_op) for i in range(len(tr.ops)))
    assert tr.meta["model"] == SMALL and tr.meta["batch"] == 2 and tr.meta["input_size"] == 4
    conv_out = [s for s in tr.storages if s.shape == (2, 8, 4, 4)]
    assert conv_out  # the input size reached the model


def test_trace_config_reaches_the_model(capsys, tmp_path):
    out_path = tmp_path / "adam.jsonl"
    rc, _, _ = _run(capsys, "trace", SMALL, "--batch", "2", "--config", "optimizer=adam", "-o", str(out_path))
    assert rc == 0
    names = [s.name for s in read_trace(out_path).storages if s.kind == "optimizer_state"]
    assert any(n.endswith("exp_avg_sq") for n in names)


def test_info_json_per_op_load(capsys, traced):
    rc, out, _ = _run(capsys, "info", str(traced), "--json", "--per-op")
    assert rc == 0
    info = json.loads(out)
    tr = read_trace(traced)
    brute = [sum(s.nbytes for s in tr.storages if s.alloc_op <= i < s.free_op) for i in range(len(tr.ops))]
    assert info["load_per_op"] == brute
    assert info["peak_load_bytes"] == max(brute) and info["peak_op"] == brute.index(max(brute))
    assert info["bytes_by_kind"]["param"] == sum(s.nbytes for s in tr.storages if s.kind == "param")
    assert "pack_order" not in info["meta"]


def test_info_table_and_plot(capsys, traced, tmp_path):
    png = tmp_path / "load.png"
    rc, out, _ = _run(capsys, "info", str(traced), "--plot", str(png))
    assert rc == 0
    assert "peak load" in out and "storages" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, needle", [
    (["trace", "no_such_model_xyz", "--batch", "2"], "no_such_model_xyz"),
    (["trace", "no_such_module_xyz:f", "--batch", "2"], "no_such_module_xyz"),
    (["trace", SMALL, "--batch", "two"], "--batch"),
    (["trace", SMALL, "--batch", "0"], "--batch"),
    (["trace", SMALL, "--batch", "2", "--config", "novalue"], "key=value"),
    (["trace", SMALL, "--batch", "2", "--config", "bogus=1"], "bogus"),
    (["trace", SMALL, "--batch", "2", "--fake", "--real"], "--real"),
    (["trace", "vgg11-cifar", "--batch", "2", "--input-size", "8"], "too small"),
])
def test_trace_user_errors_exit_2_without_output(capsys, tmp_path, argv, needle):
    out_path = tmp_path / "never.jsonl"
    rc, out, err = _run(capsys, *argv, "-o", str(out_path))
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err
    assert not out_path.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("content, extra, needle", [
    (None, [], "no such file"),
    ("not json at all\n", [], "not JSON"),
    ('{"schema": "memplan.trace", "version": 2}\n{"type": "op", "index": 0}\n', [], "name"),
    ("", ["--format", "bogus"], "bogus"),
])
def test_info_user_errors_exit_2(capsys, tmp_path, content, extra, needle):
    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_text(content)
    rc, out, err = _run(capsys, "info", str(path), *extra, "--json")
    assert rc == 2 and json.loads(out) == {"error": err.strip().removeprefix("memplan: error: ")}  # issue 29
    assert len(err.strip().splitlines()) == 1 and needle in err
