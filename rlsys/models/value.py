"""Scalar heads on a decoder: the critic's value model (a value per position) and a reward
model in training (a Hugging Face sequence-classification model: one score per sequence)."""

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

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, T) values; ``positions`` (packed rows, with a 4D ``attention_mask``): the
        position ids, else counted over the mask's real tokens."""
        hidden = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids(attention_mask) if positions is None else positions,
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


def load_score_model(path: str, dtype: str = "float32"):
    """A one-score sequence-classification model from ``path``: a reward model directory as
    it is, or a causal LM (e.g. the SFT policy) with a fresh score head, as InstructGPT
    initialises its reward model. The pad token is set, so the head finds each sequence's
    last real token."""
    import warnings

    from transformers import AutoModelForSequenceClassification

    from rlsys.models.loading import _DTYPES, load_tokenizer

    tokenizer = load_tokenizer(path)
    try:
        # a fresh head is initialised from a fixed seed: the same on every learner rank
        with warnings.catch_warnings(), torch.random.fork_rng():
            warnings.simplefilter("ignore")  # "newly initialized: score.weight" is the point
            torch.manual_seed(0)
            model = AutoModelForSequenceClassification.from_pretrained(
                path,
                num_labels=1,
                dtype=getattr(torch, _DTYPES[dtype]),
                pad_token_id=tokenizer.pad_token_id,
            )
    except OSError as exc:
        raise FileNotFoundError(
            f"model.path={path!r} is neither a local Hugging Face directory nor a reachable "
            "hub id; pass the SFT model's directory (or a reward model's)"
        ) from exc
    return model.eval()


def sequence_scores(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """(B,) float scores of a sequence-classification model: its logit at each sequence's
    last token that is not the pad token (what a reward model reads). A left-padded batch
    gets positions counted over real tokens, so the padding changes nothing; a right-padded
    one (every row starts with a real token) leaves positions to the model, as an encoder
    with offset positions (RoBERTa) needs."""
    left_padded = not bool(attention_mask[:, 0].all())
    return (
        model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids(attention_mask) if left_padded else None,
            use_cache=False,
        )
        .logits[:, 0]
        .float()
    )
