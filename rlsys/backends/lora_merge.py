"""LoRA adapters merged into a plain model's weights: what ``save_hf`` and the offline
export write for a LoRA run (a Hugging Face model with no adapters left)."""

from __future__ import annotations

import torch

from rlsys.models import lora


def merged_state(
    model: torch.nn.Module, state: dict[str, torch.Tensor], scale: float
) -> dict[str, torch.Tensor]:
    """``state`` (wire names: adapters and fully trained tensors) as full weights of the
    plain ``model``: each adapter merged into ``model``'s base weight."""
    pairs, rest = lora.split(state)
    params = model.state_dict()
    for module, (a, b) in pairs.items():
        rest[f"{module}.weight"] = lora.merge(params[f"{module}.weight"], a, b, scale)
    return rest
