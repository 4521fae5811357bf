"""Issue 29: property-based tests of `--config` values, `compare`, `fit`, `dqn train` and `conv-db`.

The same contract as tests/project/test_fuzz_user_input.py (whose checks these reuse): every run exits 0,
or exits 2 with exactly one line on stderr (with --json, that line as `{"error": ...}` on
stdout too), and leaves its outputs whole or absent and nothing else behind.

    MEMPLAN_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest -q tests/project/test_fuzz_commands.py
"""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.project.test_fuzz_user_input import BUDGETS, FUZZ, NUMBERS, TRACE_LINES, WORDS, assert_user_outcome, scratch

# Function-scoped fixtures (monkeypatch) hold for every example: each patches what is the same for all.
FUZZ_PATCHED = settings(FUZZ, suppress_health_check=[*FUZZ.suppress_health_check, HealthCheck.function_scoped_fixture])
VALUES = st.one_of(NUMBERS, st.sampled_from(["8", "16", "2", "63", "1e3", "true", "gelu", "bogus", "-1", "2.5"]))

# --- --config values: every one goes through the model's own checks --------------------------------------

MODEL_KEYS = {
    # base: small enough that a fake trace takes a fraction of a second
    "transformer-encoder": (["num_layers=1", "seq_len=4", "d_model=8", "nhead=2", "vocab_size=16"],
                            ["d_model", "nhead", "seq_len", "dropout", "vocab_size", "num_layers", "lr", "bogus"]),
    "hf:gpt2": (["n_layer=1", "n_embd=8", "n_head=2", "vocab_size=16", "seq_len=4", "n_positions=8"],
                ["n_embd", "n_head", "seq_len", "n_positions", "activation_function", "resid_pdrop",
                 "layer_norm_epsilon", "optimizer", "bogus"]),
}


@FUZZ
@given(model=st.sampled_from(sorted(MODEL_KEYS)), data=st.data())
def test_config_values(model, data):
    base, keys = MODEL_KEYS[model]
    pairs = data.draw(st.lists(st.tuples(st.sampled_from(keys), VALUES), min_size=1, max_size=3))
    with scratch() as folder:
        out = folder / "t.jsonl"
        config = [*base, *(f"{key}={value}" for key, value in pairs)]  # a later key wins
        assert_user_outcome(["trace", model, "--batch", "1", "--config", *config, "-o", out, "--json"], (out,),
                            folder)


# --- compare: every option checked before any work ------------------------------------------------------

NAMES = st.lists(st.sampled_from(["resnet18-cifar", "vgg11-cifar", "bogus", "", " ", "hf:nope"]), max_size=3)
PLANNER_NAMES = st.lists(st.sampled_from(["none", "sqrt-n", "dtr", "bogus", "autoswap:"]), max_size=3)
TOOLS = st.lists(st.sampled_from(["torch-checkpoint", "save-on-cpu", "compile-budget:0.5", "compile-budget:7",
                                  "bogus"]), max_size=2)


@pytest.fixture
def cheap_compare(monkeypatch):
    """`compare` with its points, its calibration and its plots stubbed: what is fuzzed is the checking."""
    from memplan.cost.profiles import get_profile
    from memplan.reports import compare, compare_report

    monkeypatch.setattr(compare, "compute_point", lambda task, settings: {"error": "not computed (fuzz test)"})
    monkeypatch.setattr(compare, "calibrate_cpu", lambda name=None: get_profile("h100"))
    monkeypatch.setattr(compare_report, "write_report", lambda result, out, command: {"report": str(out)})


@FUZZ_PATCHED
@given(models=NAMES, budgets=st.lists(BUDGETS, max_size=2), planners=PLANNER_NAMES, tools=TOOLS,
       profile=st.one_of(WORDS, st.sampled_from(["h100", "v100", "cpu"])), run_profile=st.sampled_from(["cpu", "bogus",
                                                                                                        "a100"]),
       memory=st.one_of(st.none(), BUDGETS))
def test_compare_options(cheap_compare, models, budgets, planners, tools, profile, run_profile, memory):
    with scratch() as folder:
        out = folder / "report"
        argv = ["compare", "--out", out, f"--models={','.join(models)}", f"--budgets={','.join(budgets)}",
                f"--planners={','.join(planners)}", f"--run-planners={','.join(planners)}",
                f"--baselines={','.join(tools)}", f"--profile={profile}", f"--run-profile={run_profile}", "--json"]
        argv += [f"--maxbatch-memory={memory}"] if memory is not None else []
        if assert_user_outcome(argv) != 0:
            assert not out.exists()  # refused before the folder was made


# --- fit: every option checked before the first trace ----------------------------------------------------


@FUZZ
@given(world=NUMBERS, device=st.one_of(WORDS, st.sampled_from(["h100", "v100"])), planners=PLANNER_NAMES,
       limit=NUMBERS, engine=st.sampled_from([[], ["--ddp"], ["--fsdp"], ["--ddp", "--fsdp"]]),
       config=st.lists(st.tuples(WORDS, VALUES), max_size=2))
def test_fit_options(world, device, planners, limit, engine, config):
    """The model name does not exist, so whatever passes the checks stops at the model lookup."""
    argv = ["fit", "no-such-model", f"--world-size={world}", f"--device={device}",
            f"--planners={','.join(planners)}", f"--limit={limit}", *engine, "--json"]
    argv += ["--config", *(f"{key}={value}" for key, value in config)] if config else []
    assert assert_user_outcome(argv) != 0


# --- dqn train ------------------------------------------------------------------------------------------


@FUZZ
@given(budgets=st.one_of(st.none(), BUDGETS), device=st.one_of(WORDS, st.sampled_from(["h100", "gtx1080ti"])),
       min_bytes=st.one_of(st.none(), NUMBERS), init=st.one_of(st.none(), st.binary(max_size=40)),
       seed=st.one_of(st.integers(-3, 3).map(str), WORDS))
def test_dqn_train_options(budgets, device, min_bytes, init, seed):
    with scratch() as folder:
        (folder / "t.jsonl").write_text("\n".join(TRACE_LINES) + "\n")
        out = folder / "w.json"
        argv = ["dqn", "train", folder / "t.jsonl", "--episodes", "1", "--time-limit", "2", f"--device={device}",
                f"--seed={seed}", "-o", out, "--json"]
        argv += [f"--budgets={budgets}"] if budgets is not None else []
        argv += [f"--min-bytes={min_bytes}"] if min_bytes is not None else []
        if init is not None:
            (folder / "init.json").write_bytes(init)
            argv += ["--init", folder / "init.json"]
        assert_user_outcome(argv, (out,), folder)


# --- conv-db ---------------------------------------------------------------------------------------------

SIZES = st.one_of(st.integers(0, 40).map(str), st.sampled_from(["99999", "x", ""]))


@st.composite
def kernel_specs(draw):
    """Kernel names as `conv-db show` writes them, with sizes that may be zero, huge or junk."""
    if draw(st.integers(0, 9)) == 0:
        return draw(WORDS)
    n, c, h, w, k, r, s = (draw(SIZES) for _ in range(7))
    kind = draw(st.sampled_from(["fwd", "bwd_data", "bwd_filter", "sideways"]))
    extra = draw(st.sampled_from(["", " p1 s1", " p0 s2 d2", " p1 s1 g2", " p1 s1 float16", " p-1"]))
    return f"{kind} n{n} c{c}x{h}x{w} k{k} {r}x{s}{extra}"


def _database_or_nothing(path) -> None:
    """A database file is a whole memplan conv-db, or there is none."""
    if path.exists():
        with sqlite3.connect(path) as conn:
            assert dict(conn.execute("SELECT key, value FROM meta"))["schema"] == "memplan.conv-db"


@FUZZ
@given(kernels=st.lists(kernel_specs(), min_size=1, max_size=2), source=st.sampled_from(["model", "cudnn", "bogus"]),
       device=st.sampled_from(["v100", "p100", "bogus"]), policy=st.sampled_from(["all", "powerOfTwo", "undivided",
                                                                                   "bogus"]))
def test_conv_db_fill_options(kernels, source, device, policy):
    with scratch() as folder:
        db = folder / "c.sqlite"
        argv = ["conv-db", "fill", db, "--source", source, "--profile", device, "--policy", policy, "--json"]
        for spec in kernels:
            argv += ["--kernel", spec]
        assert assert_user_outcome(argv, (db,), folder) != 0 or db.exists()
        _database_or_nothing(db)


@FUZZ
@given(source=st.one_of(st.none(), WORDS, st.sampled_from(["model", "model:v100", "cpu"])),
       kernel=st.one_of(st.none(), kernel_specs()), csv=st.text(max_size=120))
def test_conv_db_show_and_import(source, kernel, csv):
    with scratch() as folder:
        db = folder / "c.sqlite"
        assert assert_user_outcome(["conv-db", "fill", db, "--kernel", "fwd n2 c3x8x8 k4 3x3 p1 s1"]) == 0
        argv = ["conv-db", "show", db, "--json"]
        argv += [f"--source={source}"] if source is not None else []
        argv += [f"--kernel={kernel}"] if kernel is not None else []
        assert_user_outcome(argv)
        (folder / "bench.csv").write_text(csv)
        new = folder / "new.sqlite"
        assert_user_outcome(["conv-db", "import", new, folder / "bench.csv", "--json"], (new,), folder)
        _database_or_nothing(new)
