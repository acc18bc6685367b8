"""The reward-model worker: one sequence-classification model scoring (prompt, completion)
pairs in its own process. ``rlsys.rewards.model.RewardModelScorer`` starts one per
``reward.model.paths`` entry and combines their scores."""

from __future__ import annotations

import os

import ray


class RewardModelLoadError(RuntimeError):
    """A ``reward.model.paths`` entry that does not load as a reward model."""


@ray.remote
class RewardModelWorker:
    """Holds one reward model; ``score`` returns its scalar score per pair."""

    def __init__(
        self,
        path: str,
        dtype: str,
        batch_size: int,
        max_length: int,
        threads: int,
        num_gpus: float,
    ) -> None:
        from rlsys.runtime import limit_threads, pick_device, quiet_libraries

        if (os.path.isabs(path) or path.startswith(".")) and not os.path.isdir(path):
            # before the slow imports: a typo fails in a second
            raise RewardModelLoadError("no such directory")
        quiet_libraries()
        limit_threads(threads)
        self.device = pick_device(num_gpus)
        self.batch_size, self.max_length = batch_size, max_length
        self.tokenizer, self.model = load_reward_model(path, dtype)
        self.model.to(self.device)

    def ready(self) -> bool:
        return True

    def node_id(self) -> str:
        """The Ray node this worker runs on."""
        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        """The worker's process id."""
        return os.getpid()

    def score(self, prompts: list[str], completions: list[str], chat: bool = False) -> list[float]:
        """One score per (prompt, completion): the model's first logit at the last token of
        the pair, rendered as a user/assistant chat when ``chat`` and the tokenizer has a
        template (else ``prompt + completion``), truncated from the left to ``max_length``."""
        import torch

        if len(prompts) != len(completions):
            raise ValueError(
                f"score got {len(prompts)} prompts but {len(completions)} completions; "
                "pass one completion per prompt"
            )
        texts = [
            render_pair(self.tokenizer, p, c, chat)
            for p, c in zip(prompts, completions, strict=True)
        ]
        scores: list[float] = []
        with torch.no_grad():
            for start in range(0, len(texts), self.batch_size):
                inputs = self.tokenizer(
                    texts[start : start + self.batch_size],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    # a chat template writes its own special tokens into the text
                    add_special_tokens=not uses_chat(self.tokenizer, chat),
                    return_tensors="pt",
                ).to(self.device)
                logits = self.model(
                    input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
                ).logits
                scores.extend(logits[:, 0].float().cpu().tolist())
        return scores


def uses_chat(tokenizer, chat: bool) -> bool:
    """Whether pairs are rendered with ``tokenizer``'s chat template: asked for, and it has one."""
    return chat and bool(getattr(tokenizer, "chat_template", None))


def render_pair(tokenizer, prompt: str, completion: str, chat: bool) -> str:
    """The text a reward model scores: a user/assistant chat in ``tokenizer``'s template
    (see ``uses_chat``), else ``prompt + completion``."""
    if not uses_chat(tokenizer, chat):
        return prompt + completion
    messages = [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": completion},
    ]
    return tokenizer.apply_chat_template(messages, tokenize=False)


def load_reward_model(path: str, dtype: str = "float32"):
    """(tokenizer, model) at ``path``: right padding so the head reads the last real token,
    truncation from the left so the completion's end is kept; raises
    ``RewardModelLoadError`` for a path that is not a sequence-classification model."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from rlsys.models.loading import saved_tokenizer

    try:
        tokenizer = saved_tokenizer(path)
        model, info = AutoModelForSequenceClassification.from_pretrained(
            path, dtype=getattr(torch, dtype), output_loading_info=True
        )
    except (OSError, ValueError) as exc:
        raise RewardModelLoadError(f"{type(exc).__name__}: {exc}") from exc
    if info["missing_keys"]:
        # e.g. a causal LM: transformers would score with a randomly initialised head
        missing = ", ".join(sorted(info["missing_keys"]))
        raise RewardModelLoadError(
            f"it is not a sequence-classification model (no weights for {missing})"
        )
    tokenizer.padding_side = "right"
    tokenizer.truncation_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        # without it the head cannot find the last real token of a padded batch
        model.config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, model.eval()
