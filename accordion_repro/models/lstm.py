"""The word-language-model LSTM (PyTorch examples) the paper trains on WikiText-2.

Embedding -> dropout -> multi-layer LSTM (dropout between layers) -> dropout -> linear decoder.
With `tied` the decoder reuses the embedding matrix (Press & Wolf), so only its bias adds
parameters: V*E + sum_l 4H(in_l + H + 2) + V in total.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError

INIT_RANGE = 0.1

Hidden = tuple[torch.Tensor, torch.Tensor]


def detach_hidden(hidden):
    """Cut the autograd history of a hidden state between BPTT windows (truncated BPTT), so
    backward stops at the window boundary while the state's values carry over."""
    if isinstance(hidden, torch.Tensor):
        return hidden.detach()
    return tuple(detach_hidden(part) for part in hidden)


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab_size: int, *, num_layers: int, hidden_size: int,
                 embedding_size: int, tied: bool, dropout: float):
        super().__init__()
        if tied and embedding_size != hidden_size:
            raise ConfigError(
                "model.tied",
                f"tied weights need embedding_size == hidden_size, got {embedding_size} and "
                f"{hidden_size}; set model.tied=false or make the sizes equal")
        self.num_layers = num_layers
        self.hidden_size = hidden_size
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab_size, embedding_size)
        # nn.LSTM applies `dropout` between layers only; it warns if asked to with one layer.
        self.rnn = nn.LSTM(embedding_size, hidden_size, num_layers,
                           dropout=dropout if num_layers > 1 else 0.0)
        self.decoder = nn.Linear(hidden_size, vocab_size)
        nn.init.uniform_(self.encoder.weight, -INIT_RANGE, INIT_RANGE)
        nn.init.zeros_(self.decoder.bias)
        if tied:
            self.decoder.weight = self.encoder.weight
        else:
            nn.init.uniform_(self.decoder.weight, -INIT_RANGE, INIT_RANGE)

    def forward(self, tokens: torch.Tensor, hidden: Hidden) -> tuple[torch.Tensor, Hidden]:
        """tokens: LongTensor[T, B] -> (logits[T, B, V], new hidden)."""
        embedded = self.drop(self.encoder(tokens))
        output, hidden = self.rnn(embedded, hidden)
        return self.decoder(self.drop(output)), hidden

    def init_hidden(self, batch_size: int) -> Hidden:
        weight = self.encoder.weight
        shape = (self.num_layers, batch_size, self.hidden_size)
        # plain tensors on the weight's device (under FSDP the weight is a sharded DTensor
        # between forwards, and new_zeros would make the hidden state one too)
        return (torch.zeros(shape, dtype=weight.dtype, device=weight.device),
                torch.zeros(shape, dtype=weight.dtype, device=weight.device))
