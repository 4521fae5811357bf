"""Character-level LSTM language model (Karpathy's char-rnn): embedding, stacked LSTM, linear."""

from __future__ import annotations

from torch import nn


class CharLSTM(nn.Module):
    """Embedding -> `num_layers`-layer LSTM (batch first) -> per-step linear over the vocabulary."""

    def __init__(self, vocab_size: int, embed_size: int, hidden_size: int, num_layers: int, dropout: float):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_size)
        self.lstm = nn.LSTM(embed_size, hidden_size, num_layers, batch_first=True, dropout=dropout)
        self.decoder = nn.Linear(hidden_size, vocab_size)

    def forward(self, tokens):
        out, _ = self.lstm(self.embedding(tokens))
        return self.decoder(out)


def build(config: dict, input_size) -> nn.Module:
    """Zoo builder: vocab_size, embed_size, hidden_size, num_layers, dropout from `config`."""
    return CharLSTM(config["vocab_size"], config["embed_size"], config["hidden_size"], config["num_layers"],
                    config["dropout"])
