"""`memplan pool` end to end: JSON output, offsets file and plot, bad input."""

from __future__ import annotations

import json

from memplan.cli import main
from memplan.tracing.io import write_trace
from memplan.testing.synthetic import chain_trace


def run_json(capsys, argv):
    rc = main(argv)
    out = capsys.readouterr().out
    return rc, (json.loads(out) if rc == 0 else None)


def test_csv_json_offsets_and_plot(tmp_path, capsys):
    csv = tmp_path / "p.csv"
    csv.write_text("id,lower,upper,size\na,0,4,10\nb,0,2,6\nc,2,4,6\nd,0,4,4\n")
    offsets, png = tmp_path / "o.csv", tmp_path / "o.png"
    rc, out = run_json(capsys, ["pool", str(csv), "--allocator", "smartpool-bestfit", "--json",
                                "--offsets-out", str(offsets), "--plot", str(png)])
    assert rc == 0
    assert out["footprint_bytes"] == 20 and out["peak_load_bytes"] == 20 and out["ratio"] == 1.0
    assert out["buffers"] == 4 and "seconds" in out
    rows = dict(line.split(",") for line in offsets.read_text().splitlines()[1:])
    assert rows == {"a": "0", "b": "10", "c": "10", "d": "16"}
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_trace_input_and_unknown_allocator(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    write_trace(chain_trace(4), path)
    rc, out = run_json(capsys, ["pool", str(path), "--json", "--time-limit", "0.5"])
    assert rc == 0 and out["ratio"] >= 1.0 and out["buffers"] > 0
    assert main(["pool", str(path), "--allocator", "nope"]) == 2
    assert "known:" in capsys.readouterr().err
    assert main(["pool", str(path), "--allocator", "exact", "--offsets-out", str(tmp_path / "x.csv")]) == 2
