"""Issue 11, defect 5: `memplan run mymodule:func` where func returns `(step_fn, inputs)`."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from memplan.cli import main

from tests.user_errors import one_line_error

USER_MODULE = """
import torch
from torch import nn


def mlp(batch, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    gen = torch.Generator().manual_seed(seed + 1)
    return step, (torch.randn(batch, 8, generator=gen), torch.randint(0, 4, (batch,), generator=gen))


def hidden(batch):
    step, inputs = mlp(batch)
    return (lambda x, y: step(x, y)), inputs  # the model is two closures away: not found
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """users_models.py in the working directory, which is not on sys.path (as for a user's shell)."""
    (tmp_path / "users_models.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    monkeypatch.delitem(sys.modules, "users_models", raising=False)


@pytest.mark.parametrize("planner", ["none", "sqrt-n"])
def test_run_a_user_step_function(capsys, user_module, planner):
    assert main(["run", "users_models:mlp", "--batch", "4", "--planner", planner, "--budget", "100%",
                 "--steps", "2", "--check", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["max_param_diff"] == 0.0 and len(out["step_time_s"]) == 2


def test_check_needs_a_model_it_can_find(capsys, user_module):
    line = one_line_error(capsys, ["run", "users_models:hidden", "--batch", "4", "--steps", "1", "--check"])
    assert "--check" in line
