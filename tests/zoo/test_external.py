"""tv:, module:function and CLI config parsing."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from torch import nn

from memplan.errors import MemplanError
from memplan.zoo import Workload, get_workload, parse_config


def test_parse_config_infers_types():
    assert parse_config(["n=3", "lr=1e-3", "x=0.5", "bn=false", "on=Yes", "act=gelu", "neg=-2", "s= a "]) == {
        "n": 3, "lr": 0.001, "x": 0.5, "bn": False, "on": True, "act": "gelu", "neg": -2, "s": "a"}
    assert parse_config(None) == {} and parse_config(["a=1", "a=2"]) == {"a": 2}
    assert parse_config(["widths=8,16"]) == {"widths": "8,16"}


@pytest.mark.parametrize("bad", ["novalue", "=3"])
def test_parse_config_rejects_malformed(bad):
    with pytest.raises(MemplanError, match="key=value"):
        parse_config([bad])


def test_list_config_from_the_cli():
    # A comma list string becomes a list where the default is a list.
    workload = get_workload("hf:convnext-tiny", 1, input_size=32, num_labels=3,
                           **parse_config(["depths=1,1,1,1", "hidden_sizes=8,16,32,64"]))
    assert list(workload.model.config.depths) == [1, 1, 1, 1]
    assert list(workload.model.config.hidden_sizes) == [8, 16, 32, 64]


def _torchvision_importable() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


@pytest.mark.skipif(_torchvision_importable(), reason="torchvision imports here")
def test_tv_without_torchvision_is_a_clear_error():
    with pytest.raises(MemplanError, match="torchvision is not importable here"):
        get_workload("tv:resnet18", 2)


@pytest.fixture
def fake_torchvision(monkeypatch):
    """A stand-in torchvision with one model, to test the tv: path where torchvision does not import."""
    class TwoHeads(nn.Module):
        def __init__(self, num_classes):
            super().__init__()
            self.fc = nn.Linear(3 * 16 * 16, num_classes)

        def forward(self, x):
            logits = self.fc(x.flatten(1))
            return logits, logits * 0  # like inception's (logits, aux) in training mode

    models = types.SimpleNamespace(list_models=lambda: ["tiny"], calls=[])

    def get_model(name, weights, **kwargs):
        models.calls.append((name, weights, kwargs))
        return TwoHeads(kwargs["num_classes"])

    models.get_model = get_model
    monkeypatch.setitem(sys.modules, "torchvision", types.SimpleNamespace(models=models))
    return models


def test_tv_builds_without_weights_and_takes_the_logits(fake_torchvision):
    workload = get_workload("tv:tiny", 3, input_size=16, num_classes=4)
    assert fake_torchvision.calls == [("tiny", None, {"num_classes": 4})]
    assert workload.inputs[0].shape == (3, 3, 16, 16) and int(workload.inputs[1].max()) < 4
    before = workload.model.fc.weight.detach().clone()
    workload.step()
    assert not torch.equal(before, workload.model.fc.weight)
    with pytest.raises(MemplanError, match="no model 'nope'"):
        get_workload("tv:nope", 2)


USER_MODULE = '''
import torch
from memplan.zoo import get_workload

def pair(batch, width=4):
    w = torch.zeros(width, requires_grad=True)
    def step(x):
        loss = (w * x).sum()
        loss.backward()
        with torch.no_grad():
            w.sub_(0.1 * w.grad)
        return loss
    return step, (torch.ones(batch, width),)

def workload(batch, seed):
    return get_workload("kmeans", batch, seed=seed, n_clusters=2, dim=2)

def wrong(batch):
    return 42

not_callable = 3
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "zoo_user_models.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "zoo_user_models"
    sys.modules.pop("zoo_user_models", None)


def test_user_pair_is_wrapped(user_module):
    workload = get_workload(f"{user_module}:pair", 5, width=3)
    assert isinstance(workload, Workload) and workload.model is None
    assert workload.inputs[0].shape == (5, 3)
    assert float(workload.step()) == 0.0 and float(workload.step()) == pytest.approx(-7.5)
    assert workload.make_inputs(2)[0].shape == (2, 3)


def test_user_workload_passes_through_with_seed(user_module):
    workload = get_workload(f"{user_module}:workload", 6, seed=4)
    assert workload.name == "kmeans" and workload.seed == 4 and workload.batch == 6


@pytest.mark.parametrize("ref,message", [("no_such_module_xyz:make", "cannot import"),
                                         ("zoo_user_models:missing", "no function"),
                                         ("zoo_user_models:not_callable", "no function"),
                                         ("zoo_user_models:wrong", "expected a Workload")])
def test_user_errors(user_module, ref, message):
    with pytest.raises(MemplanError, match=message):
        get_workload(ref, 2)
