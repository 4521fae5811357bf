"""`hf:` workloads: transformers models from config classes, offline, fake and real steps."""

from __future__ import annotations

import math
import os

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from memplan.errors import MemplanError, UnknownNameError
from memplan.zoo import get_workload, known_models

pytest.importorskip("transformers")

# Published sizes (model cards / papers), rounded; matched to a relative tolerance.
PUBLISHED_PARAMS = {"hf:bert-base": 110e6, "hf:bert-large": 336e6, "hf:gpt2": 124e6, "hf:gpt2-medium": 355e6,
                    "hf:gpt2-large": 774e6, "hf:vit-base": 86.6e6, "hf:convnext-tiny": 28.6e6,
                    "hf:resnet-50": 25.6e6, "hf:llama-7b": 6.74e9}
TOLERANCE = 0.01
TINY_GPT2 = dict(n_layer=2, n_embd=32, n_head=2, seq_len=8, vocab_size=97)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models run fastest on one thread


def test_presets_are_listed():
    assert set(PUBLISHED_PARAMS) == {n for n in known_models() if n.startswith("hf:")}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_fake_step_at_default_size_and_published_size(name):
    mode = FakeTensorMode()
    with mode:
        workload = get_workload(name, 2)
        loss = workload.step()
    assert isinstance(loss, FakeTensor) and loss.shape == ()
    assert all(isinstance(p, FakeTensor) for p in workload.model.parameters())
    expected_optimizer = torch.optim.SGD if name == "hf:resnet-50" else torch.optim.Adam
    assert type(workload.optimizer) is expected_optimizer
    shape = tuple(workload.inputs[0].shape)
    assert shape == ((2, 3, 224, 224) if workload.input_size else (2, 128))
    assert abs(workload.num_parameters / PUBLISHED_PARAMS[name] - 1) < TOLERANCE
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


def test_tiny_gpt2_real_step_learns():
    workload = get_workload("hf:gpt2", 2, **TINY_GPT2)
    assert workload.inputs[0].shape == (2, 8) and int(workload.inputs[0].max()) < 97
    assert workload.model.config.n_layer == 2 and workload.model.config.n_embd == 32
    before = [p.detach().clone() for p in workload.model.parameters()]
    first = workload.step()
    assert math.isfinite(float(first)) and not first.requires_grad
    assert all(not torch.equal(a, p) for a, p in zip(before, workload.model.parameters()))
    # Random labels, same batch: Adam on a tiny model must fit them a little within a few steps.
    for _ in range(5):
        last = workload.step()
    assert float(last) < float(first)


@pytest.mark.parametrize("name,config", [
    ("hf:bert-base", dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                          vocab_size=101, seq_len=8)),
    ("hf:vit-base", dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                         patch_size=8, num_labels=7)),
    ("hf:convnext-tiny", dict(depths=[1, 1, 1, 1], hidden_sizes=[8, 16, 32, 64], num_labels=7)),
    ("hf:resnet-50", dict(depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 64, 128], embedding_size=8,
                          num_labels=7)),
])
def test_tiny_real_steps(name, config):
    image = name in ("hf:vit-base", "hf:convnext-tiny", "hf:resnet-50")
    workload = get_workload(name, 2, input_size=32 if image else None, **config)
    x, labels = workload.inputs
    assert x.shape == ((2, 3, 32, 32) if image else (2, 8))
    assert int(labels.max()) < (7 if image else 101)
    before = [p.detach().clone() for p in workload.model.parameters()]
    assert math.isfinite(float(workload.step()))
    changed = [not torch.equal(a, p) for a, p in zip(before, workload.model.parameters())]
    assert sum(changed) >= 0.9 * len(changed)  # a few (e.g. unused pooler weights) get no gradient


def test_same_seed_same_model():
    a = get_workload("hf:gpt2", 2, seed=3, **TINY_GPT2)
    b = get_workload("hf:gpt2", 2, seed=3, **TINY_GPT2)
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))
    assert torch.equal(a.inputs[0], b.inputs[0])
    # Dropout during the step draws from the caller's RNG, as in plain PyTorch.
    losses = []
    for workload in (a, b):
        torch.manual_seed(0)
        losses.append(workload.step())
    assert torch.equal(*losses)


def test_unknown_config_key_is_a_memplan_error():
    with pytest.raises(MemplanError, match="n_wings"):
        get_workload("hf:gpt2", 2, n_wings=3)
    with pytest.raises(MemplanError, match="seq_len"):
        get_workload("hf:vit-base", 2, seq_len=3)


def test_unknown_preset():
    with pytest.raises(UnknownNameError, match="hf:gpt2"):
        get_workload("hf:gpt5", 2)
