"""Issue 11, acceptance: property-based tests of what users hand the CLI.

Damaged files of every loaded format (trace JSON lines, plan JSON, DTR log, snapshot JSON
and pickle, minimalloc CSV) and random option values go through `memplan.cli.main`. Every
run must either succeed (exit 0; with --json exactly one JSON object on stdout) or refuse in
exactly one line on stderr with exit code 2 (with --json, that line as `{"error": ...}` on
stdout too): never a traceback, never another exit code, and never a partial output file or
a leftover temporary one. tests/project/test_fuzz_commands.py runs more commands through the same checks.

The example budget is kept small so the suite stays fast; for a longer run:

    MEMPLAN_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest -q tests/project/test_fuzz_user_input.py
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import tempfile
import warnings
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memplan.cli import USAGE_ERROR, main
from memplan.model import read_plan
from memplan.testing.synthetic import chain_trace
from memplan.tracing.formats import load_any
from memplan.tracing.io import write_trace

from tests.tracing.test_importers_dtr import sample_log
from tests.tracing.test_importers_snapshot import sample_snapshot

EXAMPLES = int(os.environ.get("MEMPLAN_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="MEMPLAN_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# --- running the CLI --------------------------------------------------------------------------


class _Lines(logging.Handler):
    """Counts log records at WARNING and above: the CLI prints them on stderr too."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record):
        self.count += 1


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one CLI run; stderr includes warnings and log records."""
    out, err, lines = io.StringIO(), io.StringIO(), _Lines()
    root = logging.getLogger()
    root.addHandler(lines)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rc = main([str(a) for a in argv])
    finally:
        root.removeHandler(lines)
    extra = [f"warning: {w.message}" for w in caught] + ["log record"] * lines.count
    return rc, out.getvalue(), "".join(line + "\n" for line in extra) + err.getvalue()


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()}


def assert_user_outcome(argv: list[str], outputs: tuple[Path, ...] = (), folder: Path | None = None) -> int:
    """Exit 0, or exit 2 with one stderr line; outputs whole or absent, and no other file
    appears under `folder`; returns the exit code."""
    before = _files(folder) if folder else set()
    rc, out, err = run_cli(argv)
    if rc == 0:
        if "--json" in argv:
            json.loads(out)  # exactly one JSON object
    else:
        assert rc == USAGE_ERROR, f"exit {rc} for {argv}: {err}"
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("memplan: error: "), f"{argv}: stderr {err!r}"
        if "--json" in argv:  # the same line as the one JSON object on stdout
            assert json.loads(out) == {"error": lines[0].removeprefix("memplan: error: ")}, f"{argv}: {out!r}"
        for path in outputs:
            assert not path.exists(), f"{argv}: left {path}"
    if folder:
        made = _files(folder) - before
        assert made <= set(outputs), f"{argv}: left {made}"
    return rc


@contextlib.contextmanager
def scratch():
    with tempfile.TemporaryDirectory(prefix="memplan-fuzz-") as folder:
        yield Path(folder)


# --- damaged files ----------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=6)


@st.composite
def damaged_record(draw, record):
    """`record` (a JSON object) with one field replaced, removed or added."""
    record = dict(record)
    keys = sorted(record)
    action = draw(st.sampled_from(["replace", "remove", "add"] if keys else ["add"]))
    if action == "add":
        record[draw(st.text(max_size=8))] = draw(JSON_VALUES)
    else:
        key = draw(st.sampled_from(keys))
        if action == "remove":
            del record[key]
        else:
            record[key] = draw(JSON_VALUES)
    return record


@st.composite
def damaged_lines(draw, lines: list[str]):
    """JSON lines with one line damaged, dropped, duplicated or cut, or the file cut short."""
    lines = list(lines)
    i = draw(st.integers(0, len(lines) - 1))
    action = draw(st.sampled_from(["field", "drop", "duplicate", "cut_line", "cut_file", "junk"]))
    if action == "field":
        lines[i] = json.dumps(draw(damaged_record(json.loads(lines[i]))))
    elif action == "drop":
        del lines[i]
    elif action == "duplicate":
        lines.insert(i, lines[i])
    elif action == "cut_line":
        lines[i] = lines[i][: draw(st.integers(0, max(len(lines[i]) - 1, 0)))]
    elif action == "cut_file":
        lines = lines[:i]
    else:
        lines[i] = draw(st.text(max_size=30))
    return "\n".join(lines) + "\n"


def _trace_lines() -> list[str]:
    with scratch() as folder:
        write_trace(chain_trace(3), folder / "t.jsonl")
        return (folder / "t.jsonl").read_text().splitlines()


TRACE_LINES = _trace_lines()
DTR_LINES = sample_log()
SNAPSHOT = sample_snapshot()


@FUZZ
@given(text=damaged_lines(TRACE_LINES))
def test_damaged_trace(text):
    with scratch() as folder:
        (folder / "t.jsonl").write_text(text)
        if assert_user_outcome(["info", folder / "t.jsonl", "--json"]) == 0:
            assert_user_outcome(["simulate", folder / "t.jsonl", "--json"])


@FUZZ
@given(text=damaged_lines(DTR_LINES))
def test_damaged_dtr_log(text):
    with scratch() as folder:
        (folder / "log.jsonl").write_text(text)
        if assert_user_outcome(["info", folder / "log.jsonl", "--json"]) == 0:
            assert_user_outcome(["simulate", folder / "log.jsonl", "--json"])


@st.composite
def damaged_snapshot(draw):
    """The sample snapshot with one event, block or top-level field damaged."""
    snap = json.loads(json.dumps(SNAPSHOT))
    where = draw(st.sampled_from(["event", "block", "top"]))
    if where == "event":
        events = snap["device_traces"][0]
        i = draw(st.integers(0, len(events) - 1))
        events[i] = draw(damaged_record(events[i]))
    elif where == "block":
        blocks = snap["segments"][0]["blocks"]
        i = draw(st.integers(0, len(blocks) - 1))
        blocks[i] = draw(damaged_record(blocks[i]))
    else:
        snap = draw(damaged_record(snap))
    return snap


@FUZZ
@given(snapshot=damaged_snapshot(), as_pickle=st.booleans())
def test_damaged_snapshot(snapshot, as_pickle):
    import pickle

    with scratch() as folder:
        path = folder / ("s.pickle" if as_pickle else "s.json")
        if as_pickle:
            path.write_bytes(pickle.dumps(snapshot))
        else:
            path.write_text(json.dumps(snapshot))
        assert_user_outcome(["info", path, "--format", "snapshot", "--json"])


@FUZZ
@given(data=st.binary(max_size=200))
def test_random_bytes_as_a_pickle(data):
    with scratch() as folder:
        (folder / "s.pickle").write_bytes(b"\x80" + data)
        assert_user_outcome(["info", folder / "s.pickle", "--json"])


CELLS = st.one_of(st.integers(-5, 40).map(str), st.integers(min_value=-2**70, max_value=2**70).map(str),
                  st.text(alphabet="ab0-9., x", max_size=6))


@FUZZ
@given(header=st.sampled_from(["id,lower,upper,size", "id,lower,size", "id,lower,upper,size,offset", "lower,id"]),
       rows=st.lists(st.lists(CELLS, min_size=0, max_size=5), max_size=8))
def test_damaged_minimalloc_csv(header, rows):
    with scratch() as folder:
        text = header + "\n" + "".join(",".join(row) + "\n" for row in rows)
        (folder / "p.csv").write_text(text)
        out = folder / "o.csv"
        assert_user_outcome(["pool", folder / "p.csv", "--allocator", "smartpool-bestfit", "--offsets-out", out,
                             "--json"], (out,), folder)


def _plan_json() -> dict:
    from memplan import plan

    trace = load_any_lines(TRACE_LINES)
    return plan(trace, "70%", planner="autoswap:doa", simulate_result=False).to_json()


def load_any_lines(lines: list[str]):
    with scratch() as folder:
        (folder / "t.jsonl").write_text("\n".join(lines) + "\n")
        return load_any(folder / "t.jsonl")


PLAN = _plan_json()


@st.composite
def damaged_plan(draw):
    """The plan with one decision or top-level field damaged, or its text cut short."""
    data = json.loads(json.dumps(PLAN))
    if data["decisions"] and draw(st.booleans()):
        i = draw(st.integers(0, len(data["decisions"]) - 1))
        data["decisions"][i] = draw(damaged_record(data["decisions"][i]))
    else:
        data = draw(damaged_record(data))
    text = json.dumps(data, indent=1)
    return text[: draw(st.integers(0, len(text)))] if draw(st.booleans()) else text


@FUZZ
@given(text=damaged_plan(), command=st.sampled_from(["simulate", "pool"]))
def test_damaged_plan(text, command):
    with scratch() as folder:
        (folder / "t.jsonl").write_text("\n".join(TRACE_LINES) + "\n")
        (folder / "p.json").write_text(text)
        extra = ["--allocator", "smartpool-bestfit"] if command == "pool" else []
        assert_user_outcome([command, folder / "t.jsonl", "--plan", folder / "p.json", *extra, "--json"])


# --- option values ----------------------------------------------------------------------------

WORDS = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
BUDGETS = st.one_of(WORDS, st.sampled_from(["70%", "nan%", "150%", "-1%", "0", "1e400", "12GiB", "9" * 30 + "TiB",
                                            "1.5", "abc%", "100%", " 80 % ", "none"]),
                    st.floats(allow_nan=True).map(str), st.integers().map(str))
PLANNERS = st.sampled_from(["none", "sqrt-n", "checkpoint-all", "save-on-cpu", "autoswap:doa", "autoswap:aoa",
                            "smartpool-bestfit", "bogus", "autoswap:"])
PARAMS = st.lists(st.tuples(st.sampled_from(["min_bytes", "allow_multi_swap", "n_trials", "segments", "bogus", ""]),
                            st.one_of(WORDS, st.integers(-3, 3).map(str), st.sampled_from(["true", "1e9", "nan"]))),
                  max_size=2)


@FUZZ
@given(planner=PLANNERS, budget=BUDGETS, params=PARAMS, seed=st.one_of(st.integers(-5, 5).map(str), WORDS))
def test_plan_options(planner, budget, params, seed):
    with scratch() as folder:
        (folder / "t.jsonl").write_text("\n".join(TRACE_LINES) + "\n")
        out = folder / "out" / "p.json"
        argv = ["plan", folder / "t.jsonl", "--planner", planner, f"--budget={budget}", f"--seed={seed}",
                "-o", out, "--json"]
        for key, value in params:
            argv += ["--param", f"{key}={value}"]
        if assert_user_outcome(argv, (out,), folder) == 0:
            read_plan(out, load_any(folder / "t.jsonl"))  # whole, and for this trace


@FUZZ
@given(budget=BUDGETS, device=st.one_of(WORDS, st.sampled_from(["h100", "v100", "cpu", "cuda"])))
def test_simulate_options(budget, device):
    with scratch() as folder:
        (folder / "t.jsonl").write_text("\n".join(TRACE_LINES) + "\n")
        plot = folder / "plot.png"
        assert_user_outcome(["simulate", folder / "t.jsonl", f"--budget={budget}", f"--device={device}",
                             "--plot", plot, "--json"], (plot,), folder)


NUMBERS = st.one_of(st.integers(-3, 3).map(str), WORDS, st.sampled_from(["1e9", "nan", "inf", "0.5", "-0"]))


@FUZZ
@given(command=st.sampled_from(["run", "maxbatch", "trace", "pool", "sweep"]), value=NUMBERS,
       device=st.one_of(WORDS, st.sampled_from(["cpu", "cuda", "cuda:7", "meta", "bogus"])))
def test_count_and_device_options(command, value, device):
    """Counts, sizes and devices: checked before any work (the model name does not exist, so
    whatever passes the checks stops at the model lookup)."""
    with scratch() as folder:
        (folder / "t.jsonl").write_text("\n".join(TRACE_LINES) + "\n")
        out = folder / "x.jsonl"
        argv = {
            "run": ["run", "no-such-model", f"--batch={value}", f"--steps={value}", f"--device={device}"],
            "maxbatch": ["maxbatch", "no-such-model", f"--memory={value}", f"--limit={value}", f"--device={device}"],
            "trace": ["trace", "no-such-model", f"--batch={value}", f"--warmup={value}", f"--device={device}",
                      "--config", f"n_layer={value}", "-o", out],
            "pool": ["pool", folder / "t.jsonl", f"--time-limit={value}", "--allocator", "smartpool-bestfit"],
            "sweep": ["sweep", folder / "t.jsonl", "--planner", "none", f"--budgets={value}", f"--trials={value}"],
        }[command]
        assert_user_outcome(argv, (out,), folder)
