"""DTR (simrd) operator log importer."""

import json

import pytest

from memplan.errors import TraceFormatError
from memplan.sim.stage import simulate
from memplan.tracing.formats import load_any
from memplan.tracing.importers.dtr import parse_dtr_log


def line(instr, **fields):
    return json.dumps({"INSTRUCTION": instr, **fields})


def call(name, args, results, time_ns, sizes, aliases):
    out = [line("CALL", NAME=name, ARGS=args, RESULT=results, TIME=time_ns)]
    for r, size, alias in zip(results, sizes, aliases):
        out += [line("MEMORY", NAME=r, MEMORY=str(size)), line("ALIAS", NAME=r, ALIAS=str(alias))]
    return out


def sample_log():
    """A small forward/backward log; the expected storages are spelled out in the test."""
    return [
        line("CONSTANT", NAME="junk"), line("MEMORY", NAME="junk", MEMORY="1"),  # before START: skipped
        line("ANNOTATE", ANNOTATION="START"),
        line("CONSTANT", NAME="w"), line("MEMORY", NAME="w", MEMORY="1000"),
        line("CONSTANT", NAME="x"), line("MEMORY", NAME="x", MEMORY="400"),
        *call("aten::conv", ["x", "w"], ["y"], 1500, [4000], [-1]),  # op 0
        *call("aten::view", ["y"], ["v"], 20, [0], [0]),  # op 1: v aliases y
        line("RELEASE", NAME="y"),  # y's storage lives on through v
        *call("aten::relu", ["v"], ["r"], 300, [4000], [-1]),  # op 2
        line("RELEASE", NAME="v"),  # now y's storage is freed: gone from op 3
        line("COPY", DST="r2", SRC="r"),
        line("RELEASE", NAME="r"),  # r still named by r2
        line("ANNOTATE", ANNOTATION="BACKWARD"),
        *call("aten::relu_backward", ["r2", "x"], ["dy", "tmp"], 700, [4000, 8], [-1, -1]),  # op 3
        line("RELEASE", NAME="tmp"),
        line("MUTATE", NAME="aten::add_", ARGS=["dy", "x"], MUTATE=[0], TIME=90),  # op 4, in place
        line("RELEASE", NAME="r2"),
        line("RELEASE", NAME="undefined-name"),  # ignored, as simrd does
        *call("aten::conv_backward", ["dy", "w"], ["dw"], 2100, [1000], [-1]),  # op 5
        line("RELEASE", NAME="dy"),
    ]


# (name, nbytes, kind, alloc_op, free_op, persistent), by hand from the log above.
EXPECTED = [("w", 1000, "param", 0, 6, True), ("x", 400, "param", 0, 6, True),
            ("y", 4000, "activation", 0, 3, False), ("r", 4000, "activation", 2, 5, False),
            ("dy", 4000, "temp", 3, 6, False), ("tmp", 8, "temp", 3, 4, False), ("dw", 1000, "temp", 5, 6, False)]
TIMES_NS = [1500, 20, 300, 700, 90, 2100]


def test_dtr_log_storages_ops_and_phases(tmp_path):
    path = tmp_path / "resnet.log"
    path.write_text("\n".join(sample_log()) + "\n")
    trace = load_any(path)
    assert trace.meta["source"] == "dtr"
    got = [(s.name, s.nbytes, s.kind, s.alloc_op, s.free_op, s.persistent) for s in trace.storages]
    assert got == EXPECTED
    assert [op.phase for op in trace.ops] == ["forward"] * 3 + ["backward"] * 3
    conv, view, relu, relu_bw, add, conv_bw = trace.ops
    assert conv.reads == (1, 0) and conv.writes == (2,)
    assert view.reads == (2,) and view.writes == ()
    assert relu_bw.writes == (4, 5) and add.writes == (4,) and add.reads == (4, 1)
    assert trace.producer(3) == 2 and trace.lineage(4, 5) == ((3, 4), (1, 3))


def test_dtr_baseline_time_is_the_sum_of_call_times(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(sample_log()))
    trace = load_any(path, "dtr")
    expected_s = sum(TIMES_NS) / 1e9
    assert sum(op.duration_s for op in trace.ops) == pytest.approx(expected_s, rel=1e-12)
    result = simulate(trace)
    assert result.baseline_time_s == pytest.approx(expected_s, rel=1e-9)
    assert result.peak_load_bytes == max(
        sum(n for _, n, _, lo, hi, _ in EXPECTED if lo <= i < hi) for i in range(len(TIMES_NS)))


@pytest.mark.parametrize("bad, message", [
    ([line("CALL", NAME="f", ARGS=["nope"], RESULT=["a"], TIME=1)], r":1: argument 'nope' was never defined"),
    (["{not json"], r":1: not JSON"),
    ([line("FROB")], r":1: field 'INSTRUCTION'"),
    ([line("CALL", NAME="f", ARGS=[], RESULT=["a"], TIME=1), line("MEMORY", NAME="a", MEMORY=4),
      line("RELEASE", NAME="a")], r":1: CALL result 'a' has no ALIAS line"),
    ([line("CALL", NAME="f", ARGS=[], RESULT=["a"], TIME="soon")], r":1: field 'TIME'"),
    ([line("CONSTANT", NAME="c"), line("RELEASE", NAME="c")], r":2: expected the MEMORY line"),
    ([line("MEMORY", NAME="z", MEMORY=3)], r":1: MEMORY for 'z' does not follow"),
])
def test_bad_logs_name_file_and_line(bad, message):
    with pytest.raises(TraceFormatError, match=message):
        parse_dtr_log("\n".join(bad), "x.log")


def test_fractional_times_and_bad_names():
    trace = parse_dtr_log("\n".join(call("f", [], ["a"], "12.5", [8], [-1])))
    assert trace.ops[0].duration_s == pytest.approx(12.5e-9)
    with pytest.raises(TraceFormatError, match="RESULT"):
        parse_dtr_log(line("CALL", NAME="f", ARGS=[], RESULT=[["a"]], TIME=1), "x.log")
    with pytest.raises(TraceFormatError, match="x.log:1: tensor names must be strings"):
        parse_dtr_log(line("CALL", NAME="f", ARGS=[3], RESULT=["a"], TIME=1), "x.log")
