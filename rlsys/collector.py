"""Turn prompts into scored rollout groups, and measure held-out accuracy, via a rollout pool."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlsys.config.errors import ConfigError
from rlsys.config.schema import TaskConfig
from rlsys.rewards import REWARDS, RewardFn, score
from rlsys.types import Completion, Prompt, RolloutGroup, Sample, SamplingParams

log = logging.getLogger(__name__)
GenerateFn = Callable[[list[list[int]], SamplingParams, int | None], list[list[Completion]]]


@dataclass
class EvalResult:
    """Greedy held-out figures."""

    accuracy: float
    mean_reward: float
    mean_response_tokens: float
    num_prompts: int


@dataclass(frozen=True)
class PromptFormat:
    """How a prompt's text becomes the model's input (``task.instruction``,
    ``task.chat_template``, ``task.system_prompt``); the default is the bare text."""

    instruction: str | None = None  # appended to the text after a blank line
    chat_template: bool = False  # the text is the user turn of the tokenizer's chat template
    system_prompt: str | None = None  # chat only: the system turn (None: the template's own)

    @classmethod
    def from_task(cls, cfg: TaskConfig) -> PromptFormat:
        """The format ``cfg`` asks for."""
        return cls(cfg.instruction, cfg.chat_template, cfg.system_prompt)

    def check(self, tokenizer) -> None:
        """Fail, naming the key, if ``tokenizer`` cannot render this format."""
        if self.chat_template and not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "task.chat_template=true but the tokenizer of model.path has no chat template; "
                "use an instruct/chat model or set task.chat_template=false"
            )

    def render(self, text: str, tokenizer) -> str:
        """The full prompt string; with a chat template it ends with the assistant's header."""
        content = f"{text}\n\n{self.instruction}" if self.instruction else text
        if not self.chat_template:
            return content
        messages = [{"role": "user", "content": content}]
        if self.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


class RolloutCollector:
    """Tokenises prompts, generates with ``generate`` and scores every completion."""

    def __init__(
        self,
        generate: GenerateFn,
        tokenizer,
        reward_fn: RewardFn,
        max_prompt_tokens: int,
        prompt_format: PromptFormat | None = None,
    ) -> None:
        self.generate_fn = generate
        self.tokenizer = tokenizer
        self.reward_fn = reward_fn
        self.max_prompt_tokens = max_prompt_tokens
        self.prompt_format = prompt_format or PromptFormat()
        self.prompt_format.check(tokenizer)
        self.reward_errors = 0
        self.skipped_prompts = 0

    @classmethod
    def for_task(cls, generate: GenerateFn, tokenizer, cfg: TaskConfig) -> RolloutCollector:
        """A collector with the reward, prompt length bound and prompt format of ``cfg``."""
        return cls(
            generate,
            tokenizer,
            REWARDS.get(cfg.reward),
            cfg.max_prompt_tokens,
            PromptFormat.from_task(cfg),
        )

    def encode(self, prompts: list[Prompt]) -> tuple[list[Prompt], list[list[int]]]:
        """Token ids of each formatted prompt; those over ``task.max_prompt_tokens`` are skipped.

        Special tokens come from the chat template only (``add_special_tokens=False``), so a
        BOS is never doubled.
        """
        kept, ids = [], []
        for prompt in prompts:
            text = self.prompt_format.render(prompt.text, self.tokenizer)
            tokens = self.tokenizer.encode(text, add_special_tokens=False)
            if len(tokens) > self.max_prompt_tokens:
                self.skipped_prompts += 1
                continue
            kept.append(prompt)
            ids.append(tokens)
        return kept, ids

    def generate(
        self, prompts: list[Prompt], sampling: SamplingParams, seed: int | None = None
    ) -> list[RolloutGroup]:
        """One group of ``sampling.n`` decoded, not yet scored, samples per prompt."""
        prompts, prompt_ids = self.encode(prompts)
        if not prompts:
            return []
        return self.build_groups(prompts, prompt_ids, self.generate_fn(prompt_ids, sampling, seed))

    def build_groups(
        self,
        prompts: list[Prompt],
        prompt_ids: list[list[int]],
        completions: list[list[Completion]],
        baseline: list[Completion] | None = None,
    ) -> list[RolloutGroup]:
        """Decoded, unscored groups of ``completions`` (per prompt), with ReMax's greedy
        ``baseline`` reply per prompt if given."""

        def sample(prompt: Prompt, ids: list[int], c: Completion) -> Sample:
            return Sample(
                prompt, ids, c, self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            )

        return [
            RolloutGroup(
                prompt,
                [sample(prompt, ids, c) for c in group],
                sample(prompt, ids, baseline[i]) if baseline is not None else None,
            )
            for i, (prompt, ids, group) in enumerate(
                zip(prompts, prompt_ids, completions, strict=True)
            )
        ]

    def score(self, groups: list[RolloutGroup]) -> None:
        """Fill in every sample's reward; a failing reward function scores 0 and is counted."""
        for group in groups:
            metadata = {**group.prompt.meta, "answer": group.prompt.answer}
            for sample in group.samples:
                outcome = score(self.reward_fn, group.prompt.text, sample.text, metadata)
                if outcome.error is not None:
                    if not self.reward_errors:
                        log.warning(
                            "reward function failed (scored 0, counted in "
                            "rollout/reward_errors; later failures are not logged): %s",
                            outcome.error,
                        )
                    self.reward_errors += 1
                sample.reward, sample.correct = outcome.reward, outcome.correct

    def collect(
        self, prompts: list[Prompt], sampling: SamplingParams, seed: int | None = None
    ) -> list[RolloutGroup]:
        """Generate and score."""
        groups = self.generate(prompts, sampling, seed)
        self.score(groups)
        return groups

    def evaluate(self, prompts: list[Prompt], max_new_tokens: int) -> EvalResult:
        """Greedy accuracy on ``prompts``."""
        groups = self.collect(
            prompts, SamplingParams(n=1, greedy=True, max_new_tokens=max_new_tokens)
        )
        samples = [g.samples[0] for g in groups]
        return EvalResult(
            accuracy=float(np.mean([s.correct for s in samples])) if samples else 0.0,
            mean_reward=float(np.mean([s.reward for s in samples])) if samples else 0.0,
            mean_response_tokens=float(np.mean([len(s.completion.token_ids) for s in samples]))
            if samples
            else 0.0,
            num_prompts=len(samples),
        )
