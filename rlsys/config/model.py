"""Config of the policy model: its source, dtype, and LoRA adapters (``model.*``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlsys.config.checks import non_negative, one_of, positive
from rlsys.config.errors import ConfigError


@dataclass
class LoraConfig:
    """Low-rank adapters (LoRA, Hu et al. 2021, built with PEFT) on the policy: the learner
    trains only the adapters (optimizer state for them alone), weight sync sends only them
    and each engine merges them into its copy of the base weights, and a KL term's reference
    is the learner's own base model with the adapters off (see ``reference.from_lora_base``).
    ``rlsys sft`` / ``rm`` / ``dpo`` take the same keys."""

    rank: int = 0  # adapter rank r; 0: off (full fine-tuning)
    alpha: float = 32.0  # the update is (alpha / rank) * B @ A
    dropout: float = 0.0  # dropout on each adapter's input while training
    # the nn.Linear modules (by name suffix) that get adapters: every linear layer of the
    # attention and MLP blocks of Llama/Qwen/Mistral-style models; set your own for others
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))

    def __post_init__(self) -> None:
        non_negative("model.lora.rank", self.rank)
        positive("model.lora.alpha", self.alpha)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.lora.dropout={self.dropout} must be in [0, 1)")
        if self.rank and not self.target_modules:
            raise ConfigError(
                "model.lora.target_modules is empty: name the linear modules that get "
                f"adapters, e.g. {list(LORA_TARGETS)}"
            )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        """What the adapter's product B @ A is multiplied by."""
        return self.alpha / self.rank


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class ModelConfig:
    """The policy model: a built-in tiny model, a local HF directory or a hub id."""

    path: str = "builtin:tiny"  # "builtin:<name>", a local directory, or a hub id
    dtype: str = "float32"  # parameter dtype on the learner and engines
    # Built-in models only: the architecture (Qwen2-style decoder, random init).
    hidden_size: int = 128  # width of the residual stream
    num_layers: int = 2  # decoder layers
    num_heads: int = 4  # attention heads (head_dim = hidden_size / num_heads >= 32)
    num_kv_heads: int = 2  # key/value heads (grouped-query attention)
    intermediate_size: int = 512  # MLP width
    max_position_embeddings: int = 256  # longest prompt + response in tokens
    tie_word_embeddings: bool = False  # Qwen2 default; tied embeddings slow a tiny model down
    # Vision-language models (builtin:tiny-vl, a Qwen2-VL directory): false trains the vision
    # tower too and weight syncs carry it; true keeps it as loaded and never sends it
    freeze_vision: bool = True
    lora: LoraConfig = field(default_factory=LoraConfig)  # low-rank adapters (rank 0: off)

    def __post_init__(self) -> None:
        one_of("model.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        for key in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            positive(f"model.{key}", getattr(self, key))
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"model.hidden_size={self.hidden_size} is not divisible by "
                f"model.num_heads={self.num_heads}; pick sizes that divide"
            )
        head_dim = self.hidden_size // self.num_heads
        if head_dim < 32:
            raise ConfigError(
                f"model.hidden_size / model.num_heads = {head_dim}: head_dim must be >= 32 "
                "(vLLM kernels need it); lower model.num_heads or raise model.hidden_size"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model.num_heads={self.num_heads} is not a multiple of "
                f"model.num_kv_heads={self.num_kv_heads}; make it one"
            )
