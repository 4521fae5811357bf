"""A language model built from PyTorch's own `nn.TransformerEncoder` (pre-norm, causal mask)."""

from __future__ import annotations

import torch
from torch import nn


class EncoderLM(nn.Module):
    """Token embedding + learned positions -> `num_layers` TransformerEncoder layers -> linear head."""

    def __init__(self, vocab_size: int, seq_len: int, d_model: int, nhead: int, num_layers: int, dropout: float):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.position = nn.Parameter(torch.zeros(seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=4 * d_model, dropout=dropout,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens):
        n = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device)
        return self.head(self.encoder(self.embedding(tokens) + self.position[:n], mask=mask, is_causal=True))


def build(config: dict, input_size) -> nn.Module:
    """Zoo builder: vocab_size, seq_len, d_model, nhead, num_layers, dropout from `config`."""
    return EncoderLM(config["vocab_size"], config["seq_len"], config["d_model"], config["nhead"],
                     config["num_layers"], config["dropout"])
