"""The command line starts at once (issue 37): a command that neither traces, trains nor runs a
torch-based planner imports no torch (a second or more of start-up), and `memplan --help` imports
not even numpy (command modules import their heavy layers where they run).

The commands run one after another in a fresh interpreter, which reports after each whether
torch is in `sys.modules`; a torch-based planner run last shows that the probe sees torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import memplan
from memplan.planners.base import get_planner, known_planners
from memplan.testing.synthetic import chain_trace
from memplan.tracing.io import write_trace

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "data" / "minimalloc-challenging" / "K.1048576.csv"
# A Q network; Optuna's GP sampler (auto runs autoswap:bo when its time limit leaves it a few seconds).
TORCH_PLANNERS = {"dqn", "dqn:pretrained", "dqn:refined", "autoswap:bo", "auto"}
CONV_PLANNERS = ("ucudnn:wd", "ucudnn:wr")  # planned on a trace with convolutions
PROBE = """
import json, sys
from memplan.cli import main
runs = []
for argv in json.loads(sys.argv[1]):
    try:
        code = main(argv)
    except SystemExit as exc:  # --help
        code = exc.code
    runs.append({"argv": argv, "code": code, "torch": "torch" in sys.modules, "numpy": "numpy" in sys.modules})
    with open(sys.argv[2], "w") as fh:
        json.dump(runs, fh)
"""


def probe(commands: list[list[str]], folder: Path) -> list[dict]:
    """Each command's exit code, and whether torch was loaded once it had run."""
    results = folder / "probe.json"
    subprocess.run([sys.executable, "-c", PROBE, json.dumps(commands), str(results)], cwd=folder,
                   capture_output=True, text=True, timeout=600, check=False)
    return json.loads(results.read_text())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("startup")
    write_trace(chain_trace(9), folder / "chain.jsonl")
    write_trace(memplan.trace_workload("vgg11-cifar", 2, fake=True), folder / "conv.jsonl")
    return folder


def _plan(trace: str, planner: str, budget: str) -> list[str]:
    quick = ["--time-limit", "1"] if any(p.name == "time_limit_s" for p in get_planner(planner).params) else []
    return ["plan", trace, "--planner", planner, "--budget", budget, "-o", f"{planner}.json", *quick]


def test_commands_that_do_not_train_import_no_torch(files):
    torch_free = [p for p in known_planners() if p not in TORCH_PLANNERS]
    commands = [["--help"], ["planners"], ["planners", "--json"], ["info", "chain.jsonl"], ["info", str(CSV)],
                ["pool", str(CSV), "--allocator", "smartpool", "--time-limit", "10", "--offsets-out", "k.csv"],
                *[_plan("chain.jsonl", p, "70%") for p in torch_free],
                *[_plan("conv.jsonl", p, "100%") for p in CONV_PLANNERS],
                _plan("chain.jsonl", "sqrt-n+smartpool", "80%"),
                ["simulate", "chain.jsonl", "--plan", "sqrt-n.json", "--budget", "none"],
                ["pool", "chain.jsonl", "--plan", "sqrt-n.json", "--time-limit", "2"],
                ["sweep", "chain.jsonl", "--planner", "sqrt-n", "--planner", "autoswap:doa", "--budgets", "100%,80%"],
                _plan("chain.jsonl", "dqn:pretrained", "70%")]  # the control: this one needs torch
    runs = probe(commands, files)
    assert len(runs) == len(commands)
    assert all(r["code"] in (0, 2) for r in runs), [r for r in runs if r["code"] not in (0, 2)]
    planned = [r["argv"][3] for r in runs if r["argv"][0] == "plan" and r["code"] == 0]
    assert len(planned) >= 20 and set(CONV_PLANNERS) <= set(planned)  # most planners really planned
    assert [r["argv"] for r in runs[:-1] if r["torch"]] == []
    assert runs[0]["argv"] == ["--help"] and not runs[0]["numpy"]  # the parser alone: command modules import lightly
    assert runs[-1]["code"] == 0 and runs[-1]["torch"]  # the probe does see torch when it is loaded
