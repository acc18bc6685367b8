"""The critic's model: a causal LM's decoder with a scalar value head."""

from __future__ import annotations

import torch
from torch import nn

from rlsys.data.collate import position_ids
from rlsys.models.loading import load_model


class ValueModel(nn.Module):
    """``V(prefix)`` at every position: the decoder of a causal LM (its LM head dropped) and
    a linear head to one number, zero-initialised so the first values are 0."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.config = lm.config
        self.backbone = lm.get_decoder()
        self.head = nn.Linear(lm.config.hidden_size, 1, dtype=next(lm.parameters()).dtype)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids(attention_mask),
            use_cache=False,
        ).last_hidden_state
        # A fresh (B, T) tensor, not a view: FSDP2 hooks the root module's output for backward.
        values = torch.matmul(hidden, self.head.weight[0]) + self.head.bias
        return values.float()


def load_value_model(path: str, dtype: str = "float32") -> ValueModel:
    """A value model initialised from the causal LM at ``path`` (a fresh head)."""
    return ValueModel(load_model(path, dtype))


def token_values(model: ValueModel, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """(B, T-1) values aligned with log-probabilities: entry t is V of the prefix that
    predicts token t+1."""
    return model(input_ids, attention_mask)[:, :-1]
