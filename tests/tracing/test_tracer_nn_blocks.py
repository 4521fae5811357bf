"""Issue 11, defect 4: fake and real traces agree on the standard torch.nn blocks.

Each block is traced through `trace_workload(factory)` with the model passed (the path that
raised torch's "fake mode ... doesn't match" for cloned layers) and compared with the real
trace record by record. `nn.TransformerEncoder` is also traced as a user's
`module:function` returning `(step_fn, inputs)`, where its weights came out as inputs
freed mid-backward.
"""

from __future__ import annotations

import json
import sys
import textwrap
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from memplan.cli import main
from memplan.workflows.workloads import trace_workload

from tests.tracing.test_tracer import _same_trace

BATCH, SEQ, WIDTH, HEADS, CLASSES = 4, 6, 16, 2, 5


class _Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.TransformerEncoder(nn.TransformerEncoderLayer(WIDTH, HEADS, 2 * WIDTH, batch_first=True), 2)

    def forward(self, x):
        return self.body(x).mean(1)


class _Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.TransformerDecoder(nn.TransformerDecoderLayer(WIDTH, HEADS, 2 * WIDTH, batch_first=True), 2)

    def forward(self, x):
        return self.body(x, x).mean(1)


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x)[0].mean(1)


class _Recurrent(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.rnn = cell(WIDTH, WIDTH, num_layers=2, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0][:, -1]


class _Embedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, tokens):
        return self.norm(self.embed(tokens)).mean(1)


def _conv_block(norm):
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), norm, nn.ReLU(), nn.Dropout(0.2),
                         nn.Conv2d(8, 8, 3, padding=1, groups=8),  # depthwise
                         nn.Conv2d(8, 8, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten())


BLOCKS = {
    "TransformerEncoder": _Encoder, "TransformerDecoder": _Decoder, "MultiheadAttention": _Attention,
    "LSTM": lambda: _Recurrent(nn.LSTM), "GRU": lambda: _Recurrent(nn.GRU),
    "Embedding+LayerNorm": _Embedding,
    "GroupNorm+Dropout+depthwise": lambda: _conv_block(nn.GroupNorm(2, 8)),
    "LayerNorm+Dropout+depthwise": lambda: _conv_block(nn.LayerNorm([8, 8, 8])),
}


def _factory(name):
    def build(batch, **_):
        torch.manual_seed(0)
        body = BLOCKS[name]()
        if name == "Embedding+LayerNorm":
            x = torch.randint(0, 50, (batch, SEQ))
        elif name.endswith("depthwise"):
            x = torch.randn(batch, 3, 8, 8)
        else:
            x = torch.randn(batch, SEQ, WIDTH)
        head = nn.Linear(8 if name.endswith("depthwise") else WIDTH, CLASSES)
        model = nn.Sequential(body, head)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        y = torch.randint(0, CLASSES, (batch,))

        def step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

        return SimpleNamespace(step=step, inputs=(x, y), model=model, optimizer=opt)

    build.__name__ = name
    return build


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_fake_trace_equals_real_trace(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no FakeTensor data_ptr warning reaches the user
        fake = trace_workload(_factory(name), BATCH, fake=True)
    real = trace_workload(_factory(name), BATCH, fake=False)
    _same_trace(fake, real)
    params = sum(p.numel() * p.element_size() for p in _factory(name)(BATCH).model.parameters())
    assert fake.bytes_by_kind()["param"] == params


ENCODER_MODULE = """
import torch
from torch import nn


def encoder(batch):
    torch.manual_seed(0)
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad(set_to_none=True)
        loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss

    return step, (torch.randn(batch, 6, 16),)
"""


def test_user_encoder_module_fake_equals_real(tmp_path, monkeypatch, capsys):
    (tmp_path / "user_encoder.py").write_text(textwrap.dedent(ENCODER_MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    monkeypatch.delitem(sys.modules, "user_encoder", raising=False)
    out = {}
    for mode in ("--fake", "--real"):
        assert main(["trace", "user_encoder:encoder", "--batch", "4", mode, "-o", mode[2:] + ".jsonl", "--json"]) == 0
        out[mode] = json.loads(capsys.readouterr().out)
    assert out["--fake"]["peak_load_bytes"] == out["--real"]["peak_load_bytes"]
    assert out["--fake"]["bytes_by_kind"] == out["--real"]["bytes_by_kind"]
    assert "input" not in out["--fake"]["bytes_by_kind"] or out["--fake"]["bytes_by_kind"]["input"] == 4 * 6 * 16 * 4


def test_zoo_lstm_fake_equals_real():
    """The zoo's char-RNN runs oneDNN's LSTM on the CPU, whose workspace the fake kernel left empty."""
    small = {"seq_len": 8, "embed_size": 16, "hidden_size": 32, "dropout": 0.1}
    fake = trace_workload("lstm", 2, fake=True, **small)
    _same_trace(fake, trace_workload("lstm", 2, fake=False, **small))
    assert any(s.dtype == "uint8" and s.nbytes > 0 for s in fake.storages)  # the workspaces


TINY_HF = {
    "hf:gpt2": dict(n_layer=1, n_embd=32, n_head=2, vocab_size=101, n_positions=16, seq_len=8),
    "hf:bert-base": dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                         vocab_size=101, seq_len=8),
    "hf:vit-base": dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                        patch_size=8, num_labels=7, input_size=32),
}


@pytest.mark.parametrize("name", sorted(TINY_HF))
def test_hf_fake_equals_real(name):
    """GPT-2 without an attention mask looked for packed sequences in its position ids: a branch on
    tensor values that real tensors take and fake ones cannot; the zoo passes an all-ones mask."""
    pytest.importorskip("transformers")
    fake = trace_workload(name, 2, fake=True, **TINY_HF[name])
    _same_trace(fake, trace_workload(name, 2, fake=False, **TINY_HF[name]))
