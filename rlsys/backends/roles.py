"""What a backend's model is, one class per role: the policy (log-probabilities of its
tokens), the critic (a value head on the same decoder) and the reward model (a
sequence-classification model: one score per sequence). A role says how its model loads,
what a training pass shows the objective, and what it may do: train LoRA adapters, be
written as a Hugging Face directory. The backend (``engine.py``) holds one of these and asks
it, instead of branching on the role's name."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from rlsys.models.loading import load_model
from rlsys.models.reward_model import load_reward_model
from rlsys.models.value import load_score_model, load_value_model, sequence_scores
from rlsys.models.vision import SUPPRESS_KEY

if TYPE_CHECKING:
    from rlsys.backends.engine import BackendEngine

Tensors = dict[str, torch.Tensor]
_VISION_KEYS = ("pixel_values", "image_grid_thw", "mm_token_type_ids", SUPPRESS_KEY)
SCORE_HEADS = ("score.",)  # a sequence-classification model's head: trained in full under LoRA


def vision(t: Tensors) -> Tensors | None:
    """A micro-batch's image inputs (VL models), None without."""
    return {k: t[k] for k in _VISION_KEYS if k in t} or None


class ModelRole:
    """What one role's model is; a subclass per role."""

    name: ClassVar[str]  # the backend's ``role`` argument
    lora: ClassVar[bool] = True  # may train LoRA adapters
    hf_form: ClassVar[bool] = True  # save_hf can write it as a Hugging Face directory
    lora_heads: ClassVar[tuple[str, ...]] = ()  # trained in full under LoRA (name prefixes)
    padding_side: ClassVar[str | None] = None  # how its saved tokenizer pads (None: as loaded)
    packs: ClassVar[bool] = False  # its passes take packed micro-batches (learner.packing)
    shares_prompts: ClassVar[bool] = False  # packed, a prompt once (learner.share_prompts)

    def load(self, path: str, dtype: str, trainable: bool) -> torch.nn.Module:
        """The model at ``path`` in ``dtype``, on the CPU (``trainable``: to be trained)."""
        raise NotImplementedError

    def outputs(self, backend: BackendEngine, t: Tensors, entropy_grad: bool) -> Tensors:
        """What the objective sees for the micro-batch ``t`` in a training pass."""
        raise NotImplementedError


class PolicyRole(ModelRole):
    """The policy: a causal LM; the objective sees its tokens' log-probabilities and
    entropy."""

    name = "policy"
    packs = True
    shares_prompts = True

    def load(self, path: str, dtype: str, trainable: bool) -> torch.nn.Module:
        return load_model(path, dtype)

    def outputs(self, backend: BackendEngine, t: Tensors, entropy_grad: bool) -> Tensors:
        logprobs, entropy = backend._token_logprobs(t, entropy=True, entropy_grad=entropy_grad)
        return {"logprobs": logprobs, "entropy": entropy}


class CriticRole(ModelRole):
    """The critic: the decoder with a value head; the objective sees its per-token values.
    It trains in full (no LoRA) and has no Hugging Face form (a checkpoint keeps it)."""

    name = "value"
    lora = False
    packs = True
    shares_prompts = True
    hf_form = False

    def load(self, path: str, dtype: str, trainable: bool) -> torch.nn.Module:
        return load_value_model(path, dtype)

    def outputs(self, backend: BackendEngine, t: Tensors, entropy_grad: bool) -> Tensors:
        return {"values": backend._token_values(t)}


class RewardModelRole(ModelRole):
    """A reward model: a sequence-classification model; the objective sees one score per
    sequence. Trained, it starts from any model (a fresh score head, trained in full under
    LoRA); scoring, its head must be a trained one. Its tokenizer pads on the right (see
    ``reward_tokenizer``)."""

    name = "reward"
    lora_heads = SCORE_HEADS
    padding_side = "right"

    def load(self, path: str, dtype: str, trainable: bool) -> torch.nn.Module:
        if trainable:
            return load_score_model(path, dtype)
        return load_reward_model(path, dtype)[1]

    def outputs(self, backend: BackendEngine, t: Tensors, entropy_grad: bool) -> Tensors:
        return {"scores": sequence_scores(backend.model, t["input_ids"], t["attention_mask"])}


MODEL_ROLES: dict[str, ModelRole] = {
    role.name: role for role in (PolicyRole(), CriticRole(), RewardModelRole())
}
ROLES = tuple(MODEL_ROLES)  # the backend's role names
