"""`memplan conv-db fill|show|import`: rows from the model and cpu sources, reuse of what is
there, DeepBench and database imports, and one error line with exit 2 for a corrupt
database or an unknown kernel. The cudnn source runs only on a CUDA GPU (marked gpu)."""

import json
import sqlite3

import pytest
import torch

from memplan.cli import main
from memplan.conv.db import ConvDB, Row
from memplan.conv.kernels import Kernel, parse_kernel

SPEC = "fwd n4 c8x12x12 k16 3x3 p1 s1"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_fill_then_show_reuses_what_is_there(tmp_path, capsys):
    db = str(tmp_path / "c.sqlite")
    code, out, _ = run(capsys, "conv-db", "fill", db, "--kernel", SPEC, "--kernel", SPEC.replace("fwd", "bwd_filter"),
                       "--source", "model", "--profile", "v100", "--json")
    first = json.loads(out)
    assert code == 0 and first["benchmarked"] == 2 * 3 and first["rows_added"] > 6  # sizes 1, 2, 4; several families
    code, out, _ = run(capsys, "conv-db", "fill", db, "--kernel", SPEC, "--source", "model", "--json")
    assert code == 0 and json.loads(out)["rows_added"] == 0
    code, out, _ = run(capsys, "conv-db", "show", db, "--kernel", SPEC, "--json")
    rows = json.loads(out)["rows"]
    assert code == 0 and {r["source"] for r in rows} == {"model:v100"}
    assert any(r["algo"] == "implicit_gemm" and r["workspace_bytes"] == 0 for r in rows)
    assert rows == sorted(rows, key=lambda r: r["time_s"])


def test_cpu_rows_are_measured_here_with_workspace_unknown(tmp_path, capsys):
    db = tmp_path / "c.sqlite"
    code, out, _ = run(capsys, "conv-db", "fill", str(db), "--kernel", SPEC, "--source", "cpu", "--policy",
                       "undivided", "--json")
    assert code == 0 and json.loads(out)["source"].startswith("cpu:")
    with ConvDB(db) as cdb:
        (row,) = cdb.rows()
    assert row.kernel == parse_kernel(SPEC) and row.workspace_bytes is None and row.time_s > 0


def test_a_trace_fills_every_kernel(tmp_path, capsys):
    from tests.planners.test_ucudnn import cnn_trace

    from memplan.tracing.io import write_trace

    path = tmp_path / "t.jsonl"
    write_trace(cnn_trace(batch=4, side=8), path)
    code, out, _ = run(capsys, "conv-db", "fill", str(tmp_path / "c.sqlite"), str(path), "--policy", "undivided",
                       "--json")
    assert code == 0 and json.loads(out)["kernels"] == 3 * 3 - 1  # the first conv needs no input gradient


def test_import_deepbench_and_another_database(tmp_path, capsys):
    csv = tmp_path / "conv.csv"
    csv.write_text("gpu,source,W,H,C,N,K,S,R,pad_w,pad_h,stride_w,stride_h,fwd_ms,bwd_data_ms,bwd_filter_ms\n"
                   "NVIDIA V100,x,12,12,8,4,16,3,3,1,1,1,1,0.5,,0.25\n")
    db, other = str(tmp_path / "a.sqlite"), tmp_path / "b.sqlite"
    code, out, _ = run(capsys, "conv-db", "import", db, str(csv), "--json")
    assert code == 0 and json.loads(out)["rows"] == 2
    with ConvDB(other) as cdb:
        cdb.put([Row(kernel=parse_kernel(SPEC), algo="x", source="mine", time_s=1.0, workspace_bytes=7)])
    code, out, _ = run(capsys, "conv-db", "import", db, str(other), "--json")
    assert code == 0 and json.loads(out)["rows"] == 1
    code, out, _ = run(capsys, "conv-db", "show", db, "--json")
    assert {s["source"]: s["rows"] for s in json.loads(out)["sources"]} == {"deepbench:v100": 2, "mine": 1}
    code, out, _ = run(capsys, "conv-db", "show", db, "--kernel", SPEC, "--source", "deepbench:v100", "--json")
    assert json.loads(out)["rows"] == [{"source": "deepbench:v100", "algo": "fastest", "time_s": 0.5e-3,
                                        "workspace_bytes": None}]


@pytest.mark.parametrize("content", [b"not a database at all\n", b"SQLite format 3\x00" + b"\x00" * 84, None, "foreign"])
def test_a_corrupt_or_foreign_database_is_one_error_line(tmp_path, capsys, content):
    db = tmp_path / "c.sqlite"
    if content == "foreign":
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE meta (key TEXT, value TEXT)")
        conn.execute("INSERT INTO meta VALUES ('schema', 'someone-else')")
        conn.commit()
        conn.close()
    elif content is not None:
        db.write_bytes(content)
    for argv in (["show", str(db)], ["fill", str(db), "--kernel", SPEC]):
        if content is None and argv[0] == "fill":
            continue  # fill creates a missing database
        code, out, err = run(capsys, "conv-db", *argv)
        assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("memplan: error: ")


def test_an_unknown_kernel_is_one_error_line(tmp_path, capsys):
    db = str(tmp_path / "c.sqlite")
    run(capsys, "conv-db", "fill", db, "--kernel", SPEC, "--policy", "undivided")
    for spec, message in ((SPEC.replace("n4", "n5"), "no rows for kernel"), ("conv 3x3", "not a convolution kernel"),
                          ("fwd n4 c8x12x12 k16 3x3 p1 s1 int8", "not a convolution kernel")):
        code, out, err = run(capsys, "conv-db", "show", db, "--kernel", spec)
        assert code == 2 and out == "" and err.count("\n") == 1 and message in err
    code, _, err = run(capsys, "conv-db", "fill", db, "--kernel", SPEC, "--source", "tpu")
    assert code == 2 and "tpu" in err


def test_kernel_names_round_trip():
    for k in (Kernel(kind="fwd", n=64, c=96, h=27, w=27, k=256, r=5, s=5, pad_h=2, pad_w=2),
              Kernel(kind="bwd_data", n=3, c=8, h=9, w=7, k=4, r=3, s=1, pad_h=1, stride_h=2, dil_h=2, dil_w=2,
                     groups=2, dtype="float16"),
              Kernel(kind="bwd_filter", n=1, c=4, h=5, w=7, k=2, r=2, s=3, dil_h=1, dil_w=3)):  # fits: 7 wide
        assert parse_kernel(k.describe()) == k


@pytest.mark.gpu
@needs_gpu
def test_cudnn_source_measures_engines_on_a_gpu(tmp_path, capsys):
    pytest.importorskip("cudnn")
    db = str(tmp_path / "c.sqlite")
    code, out, _ = run(capsys, "conv-db", "fill", db, "--kernel", SPEC, "--source", "cudnn", "--policy", "undivided",
                       "--json")
    assert code == 0 and json.loads(out)["source"].startswith("cudnn:")
    with ConvDB(db) as cdb:
        rows = cdb.rows()
    assert rows and all(r.time_s > 0 and r.workspace_bytes is not None for r in rows)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a host without a GPU")
def test_the_cudnn_source_without_a_gpu_is_one_error_line(tmp_path, capsys):
    code, out, err = run(capsys, "conv-db", "fill", str(tmp_path / "c.sqlite"), "--kernel", SPEC, "--source", "cudnn")
    assert code == 2 and out == "" and err.count("\n") == 1 and "CUDA GPU" in err
