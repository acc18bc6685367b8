"""Token log-probabilities and entropies of a causal LM (shared by learner and reference)."""

from __future__ import annotations

import torch

from rlsys.data.collate import position_ids


def _logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    return model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
        use_cache=False,
    ).logits[:, :-1]


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log pi(x_{t+1} | x_{<=t}) and the policy entropy at each position, both (B, T-1).

    Logits are divided by the sampling temperature so that these match the distribution the
    engine sampled from (the behaviour policy). ``entropy_grad=False`` computes the entropy
    without a graph (a metric only), which saves a (B, T, V) activation in training.
    """
    logits = _logits(model, input_ids, attention_mask).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logprobs = logp_all.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logprobs, entropy


def greedy_next_tokens(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """The argmax next token after every prefix, (B, T-1): what greedy decoding would pick."""
    return _logits(model, input_ids, attention_mask).argmax(-1)
