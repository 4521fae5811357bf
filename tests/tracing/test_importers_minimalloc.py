"""minimalloc CSV import/export, and format detection in load_any."""

import csv
import json
import pickle
from pathlib import Path

import pytest

from memplan.errors import MemplanError, TraceFormatError, UnknownNameError
from memplan.pool.problem import from_storages, read_minimalloc_csv
from memplan.testing.synthetic import chain_trace
from memplan.tracing.formats import FORMATS, detect_format, load_any
from memplan.tracing.importers.minimalloc import read_minimalloc, write_minimalloc_csv
from memplan.tracing.io import write_trace

CHALLENGING = Path(__file__).resolve().parents[2] / "data" / "minimalloc-challenging"  # vendored, see its SOURCE.md
# Peak loads stated in SOURCE.md there.
PEAKS = {"A": 1048576, "B": 1048576, "C": 1039360, "D": 986112, "E": 1048576, "F": 1048576,
         "G": 1048576, "H": 1048576, "I": 1048576, "J": 989184, "K": 1048576}


def oracle_peak(rows):
    """Peak of half-open intervals by sweeping sorted events (frees before allocs at a time)."""
    events = sorted([(lo, 1, size) for _, lo, _, size in rows] + [(hi, 0, -size) for _, _, hi, size in rows])
    load = peak = 0
    for _, _, delta in events:
        load += delta
        peak = max(peak, load)
    return peak


@pytest.mark.parametrize("name", sorted(PEAKS))
def test_challenging_files_have_the_stated_peak(name):
    (path,) = CHALLENGING.glob(f"{name}.*.csv")
    trace = load_any(path)
    assert trace.meta["source"] == "minimalloc" and trace.ops == ()
    assert trace.peak_load_bytes == PEAKS[name]
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    assert trace.num_steps_hint == max(int(r["upper"]) for r in rows)
    assert [s.name for s in trace.storages] == [r["id"] for r in rows]


def test_string_ids_and_lifetimes(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("id,lower,upper,size\nconv1.out,0,3,64\nb,2,5,32\n\nc,4,6,16\n")
    trace = read_minimalloc(path)
    assert [(s.name, s.alloc_op, s.free_op, s.nbytes, s.kind) for s in trace.storages] == [
        ("conv1.out", 0, 3, 64, "temp"), ("b", 2, 5, 32, "temp"), ("c", 4, 6, 16, "temp")]
    assert trace.num_steps == 6 and trace.load.tolist() == [64, 64, 96, 32, 48, 16]


@pytest.mark.parametrize("text, message", [
    ("a,b,c,d\n1,2,3,4\n", r"p.csv:1: expected the header"),
    ("id,lower,upper,size\nx,0,2,8\ny,1,two,8\n", r"p.csv:3: field 'upper': expected an integer"),
    ("id,lower,upper,size\nx,3,3,8\n", r"p.csv:2: field 'upper'"),
    ("id,lower,upper,size\nx,0,3,0\n", r"p.csv:2: field 'size'"),
    ("id,lower,upper,size\nx,0\n", r"p.csv:2: expected 4 columns"),
])
def test_bad_csv_names_line_and_field(tmp_path, text, message):
    path = tmp_path / "p.csv"
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=message):
        load_any(path, "minimalloc")


def test_export_trace_roundtrips_through_the_pool_reader(tmp_path):
    trace = chain_trace(6, sizes=[10, 20, 30, 40, 50, 60], param_bytes=3)
    path = tmp_path / "chain.csv"
    n = write_minimalloc_csv(trace, path)
    expected = [(str(s.id), s.alloc_op, s.free_op, s.nbytes) for s in trace.storages
                if s.nbytes > 0 and s.free_op > s.alloc_op]
    with open(path) as fh:
        rows = [(r["id"], int(r["lower"]), int(r["upper"]), int(r["size"])) for r in csv.DictReader(fh)]
    assert n == len(rows) and rows == expected
    assert read_minimalloc(path).peak_load_bytes == oracle_peak(rows) == trace.peak_load_bytes
    problem = read_minimalloc_csv(path)  # the pool engineer's reader agrees
    assert problem.peak_load_bytes == oracle_peak(rows)


def test_export_pool_problem_and_rows(tmp_path):
    trace = chain_trace(4)
    problem = from_storages(trace)
    path = tmp_path / "problem.csv"
    assert write_minimalloc_csv(problem, path) == problem.n
    again = read_minimalloc(path)
    assert again.peak_load_bytes == problem.peak_load_bytes
    rows = [("a", 0, 2, 5), ("b", 1, 3, 7)]
    assert write_minimalloc_csv(rows, path) == 2
    assert path.read_text() == "id,lower,upper,size\na,0,2,5\nb,1,3,7\n"
    # Names survive a minimalloc -> trace -> minimalloc round trip.
    assert write_minimalloc_csv(read_minimalloc(path), tmp_path / "again.csv") == 2
    assert (tmp_path / "again.csv").read_text() == path.read_text()
    with pytest.raises(MemplanError, match="buffer 0"):
        write_minimalloc_csv([("a", 3, 3, 5)], path)
    with pytest.raises(MemplanError, match="buffer 1"):
        write_minimalloc_csv([("a", 0, 3, 5), ("b", 1)], path)


def test_load_any_detects_every_format(tmp_path):
    files = {
        "memplan": tmp_path / "t.jsonl",
        "minimalloc": tmp_path / "m.txt",
        "dtr": tmp_path / "d.txt",
        "snapshot": tmp_path / "s.bin",
    }
    trace = chain_trace(3)
    write_trace(trace, files["memplan"])
    files["minimalloc"].write_text("id,lower,upper,size\n0,0,1,4\n")
    files["dtr"].write_text(json.dumps({"INSTRUCTION": "CONSTANT", "NAME": "w"}) + "\n"
                            + json.dumps({"INSTRUCTION": "MEMORY", "NAME": "w", "MEMORY": "8"}) + "\n")
    files["snapshot"].write_bytes(pickle.dumps({"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 16, "size": 8, "stream": 0, "frames": []}]]}))
    for fmt, path in files.items():
        assert detect_format(path) == fmt
        loaded = load_any(path)
        assert (loaded == trace) if fmt == "memplan" else loaded.meta["source"] == fmt
    assert set(FORMATS) == set(files)


def test_load_any_errors(tmp_path):
    with pytest.raises(MemplanError, match="no such file"):
        load_any(tmp_path / "missing.jsonl")
    path = tmp_path / "x.txt"
    path.write_text("hello world\n")
    with pytest.raises(UnknownNameError, match="known: dtr, memplan, minimalloc, snapshot"):
        load_any(path, "parquet")
    with pytest.raises(TraceFormatError, match=r"x.txt:1: .*not a memplan trace, snapshot"):
        load_any(path)
    with pytest.raises(TraceFormatError, match="unknown trace format"):
        detect_format(path)
    # A file named as one format but holding another reports the named format's complaint.
    with pytest.raises(TraceFormatError, match="x.txt:1: expected the header"):
        load_any(path, "minimalloc")
