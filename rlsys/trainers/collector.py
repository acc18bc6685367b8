"""Turn prompts into scored rollout groups, and measure held-out accuracy, via a rollout pool."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rlsys.agents.runner import AgentRunner, load_agent
from rlsys.config.env import AGENT_ENV
from rlsys.config.errors import ConfigError
from rlsys.config.reward import RewardConfig
from rlsys.config.schema import TaskConfig
from rlsys.envs import EpisodeRunner, make_factory
from rlsys.envs.chat_turns import ChatTurns
from rlsys.envs.tool_formats import ToolFormat, make_tool_format
from rlsys.rewards.scorer import RewardScorer
from rlsys.types import Completion, Prompt, RolloutGroup, Sample, SamplingParams, pixels_of

log = logging.getLogger(__name__)
# (prompt ids, sampling, seed, per-prompt token budgets[, per-prompt images]) -> completions
# per prompt; the images (PromptPixels) are passed only when a prompt has some
GenerateFn = Callable[..., list[list[Completion]]]


@dataclass
class EvalResult:
    """Greedy held-out figures."""

    accuracy: float
    mean_reward: float
    mean_response_tokens: float
    num_prompts: int
    accuracy_by: dict[str, float] = field(default_factory=dict)  # group_by value -> accuracy


@dataclass(frozen=True)
class PromptFormat:
    """How a prompt's text becomes the model's input (``task.instruction``,
    ``task.chat_template``, ``task.system_prompt``, and the tools a chat tool format declares);
    the default is the bare text."""

    instruction: str | None = None  # appended to the text after a blank line
    chat_template: bool = False  # the text is the user turn of the tokenizer's chat template
    system_prompt: str | None = None  # chat only: the system turn (None: the template's own)
    tool_format: ToolFormat | None = None  # chat only: declares ``tools`` in the prompt
    tools: tuple[dict, ...] = ()  # the environment's function specs

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

    def messages(self, text: str) -> list[dict]:
        """The chat messages of a prompt: the system turn if set, then the user turn."""
        content = f"{text}\n\n{self.instruction}" if self.instruction else text
        messages = [{"role": "user", "content": content}]
        if self.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def render(self, text: str, tokenizer, messages: list[dict] | None = None) -> str:
        """The full prompt string; with a chat template it ends with the assistant's header.
        A prompt the dataset gave as chat ``messages`` is always rendered with the template
        (the instruction appended to its last user turn, the system prompt added if it has
        none)."""
        if messages is not None:
            return self._render_messages(messages, tokenizer)
        if not self.chat_template:
            return f"{text}\n\n{self.instruction}" if self.instruction else text
        messages = self.messages(text)
        if self.tool_format is not None:
            return self.tool_format.render(tokenizer, messages, list(self.tools), True)
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def _render_messages(self, messages: list[dict], tokenizer) -> str:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                "the dataset gives its prompts as chat messages (verl's layout) but the "
                "tokenizer of model.path has no chat template; use an instruct/chat model"
            )
        messages = [dict(m) for m in messages]
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if self.instruction and users:
            last = messages[users[-1]]
            last["content"] = f"{last['content']}\n\n{self.instruction}"
        if self.system_prompt is not None and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        if self.tool_format is not None:
            return self.tool_format.render(tokenizer, messages, list(self.tools), True)
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


class RolloutCollector:
    """Tokenises prompts, generates with ``generate`` (through the task's environment when it
    is multi-turn) and scores every completion with ``scorer``."""

    def __init__(
        self,
        generate: GenerateFn | None,
        tokenizer,
        scorer,
        max_prompt_tokens: int | None,
        prompt_format: PromptFormat | None = None,
        episodes: EpisodeRunner | AgentRunner | None = None,
    ) -> None:
        self.generate_fn = generate
        self.tokenizer = tokenizer
        self.scorer = scorer  # .score([(prompt, completion, metadata)]) -> [RewardOutcome]
        # None: unresolved (task.max_prompt_tokens=null outside an rlsys command, which
        # resolves it from the model, as in tests and benchmarks): no bound of its own
        self.max_prompt_tokens = max_prompt_tokens
        self._longest: int | None = None  # characters of the longest token (_longest_token)
        self.prompt_format = prompt_format or PromptFormat()
        self.prompt_format.check(tokenizer)
        self.episodes = episodes
        # a VL model's image processor (rlsys.models.loading.load_tokenizer sets it)
        self.images = getattr(tokenizer, "image_encoder", None)
        self.reward_errors = 0
        self.skipped_prompts = 0
        self._warned_long = False

    @classmethod
    def for_task(
        cls,
        generate: GenerateFn | None,
        tokenizer,
        cfg: TaskConfig,
        reward: RewardConfig | None = None,
        scorer=None,
    ) -> RolloutCollector:
        """A collector with the prompt length bound, prompt format and environment of
        ``cfg``, scoring with ``scorer`` (default: the rule-based rewards of ``reward``, in
        this process)."""
        if scorer is None:
            scorer = RewardScorer.from_config(cfg.reward, reward or RewardConfig())
        prompt_format, episodes = PromptFormat.from_task(cfg), None
        if cfg.env.name == AGENT_ENV:  # the agent writes its own conversation
            prompt_format.check(tokenizer)
            fmt = make_tool_format(cfg.env.tool_format, tokenizer, cfg.chat_template)
            agent = load_agent(cfg.env.agent or "")
            episodes = AgentRunner(agent, tokenizer, fmt, cfg.env, cfg.max_prompt_tokens)
        elif cfg.env.name is not None:
            factory = make_factory(cfg.env)
            prompt_format.check(tokenizer)
            fmt = make_tool_format(cfg.env.tool_format, tokenizer, cfg.chat_template)
            turns = None
            if fmt.chat:  # the prompt declares the tools; turns translate calls and results
                bound = cfg.env.max_observation_tokens
                turns = ChatTurns(fmt, factory, tokenizer, prompt_format.messages, bound)
                prompt_format = dataclasses.replace(
                    prompt_format, tool_format=fmt, tools=tuple(turns.tools)
                )
            episodes = EpisodeRunner(factory, tokenizer, cfg.env, turns)
        return cls(generate, tokenizer, scorer, cfg.max_prompt_tokens, prompt_format, episodes)

    def encode(self, prompts: list[Prompt]) -> tuple[list[Prompt], list[list[int]]]:
        """Token ids of each formatted prompt; those over ``task.max_prompt_tokens`` are skipped
        and counted (``skipped_prompts``), the first time with a warning. A command screens
        its task's prompts first (``TaskSplits.screen_prompts``, a warning per split), so
        this drops only prompts that came another way.

        Special tokens come from the chat template only (``add_special_tokens=False``), so a
        BOS is never doubled.
        """
        kept, ids, longest = [], [], 0
        for prompt in prompts:
            if self._surely_over(prompt.text):
                longest = max(longest, self.prompt_length(prompt))
                continue
            prompt, tokens = self._tokens(prompt)
            if self.max_prompt_tokens is not None and len(tokens) > self.max_prompt_tokens:
                longest = max(longest, len(tokens))
                continue
            kept.append(prompt)
            ids.append(tokens)
        dropped = len(prompts) - len(kept)
        self.skipped_prompts += dropped
        if dropped and not self._warned_long:
            self._warned_long = True
            log.warning(
                "%d of %d prompts are longer than task.max_prompt_tokens=%d and not generated "
                "for (the longest has %d tokens); raise task.max_prompt_tokens to keep them. "
                "Later ones are only counted (summary.json's prompts_skipped_too_long)",
                dropped,
                len(prompts),
                self.max_prompt_tokens,
                longest,
            )
        return kept, ids

    def prompt_length(self, prompt: Prompt) -> int:
        """The token count of ``prompt`` as ``encode`` formats it (images included); for a
        text too long to fit ``task.max_prompt_tokens`` whatever its tokens, a lower bound
        that is over the limit (see ``_surely_over``)."""
        if self._surely_over(prompt.text):
            return math.ceil(len(prompt.text) / self._longest_token())
        return len(self._tokens(prompt)[1])

    def _surely_over(self, text: str) -> bool:
        """Whether ``text`` cannot fit ``task.max_prompt_tokens`` whatever it tokenizes to: no
        token of the vocabulary spans more than ``_longest_token`` characters, so a longer
        text has more tokens than the limit. Such prompts are skipped without tokenizing them
        (a 10 MB prompt took 25 s and 3.8 GiB to tokenize, only to be skipped)."""
        limit = self.max_prompt_tokens
        return limit is not None and len(text) > limit * self._longest_token()

    def _longest_token(self) -> int:
        """Characters of the vocabulary's longest token (byte-level vocabularies spell each
        byte as one character, so this bounds bytes too); read once."""
        if self._longest is None:
            vocab = self.tokenizer.get_vocab()
            self._longest = max((len(token) for token in vocab), default=1) or 1
        return self._longest

    def _tokens(self, prompt: Prompt) -> tuple[Prompt, list[int]]:
        """``prompt`` (with its images processed) and its formatted prompt's token ids."""
        text = prompt.text
        if prompt.images:  # processed now: the pixels travel with the prompt from here on
            prompt = self._with_pixels(prompt)
            text = self.images.text(text, prompt.pixels)
        text = self.prompt_format.render(text, self.tokenizer, prompt.messages)
        return prompt, self.tokenizer.encode(text, add_special_tokens=False)

    def _with_pixels(self, prompt: Prompt) -> Prompt:
        """``prompt`` with its images processed (a ConfigError if the model takes none)."""
        if self.images is None:
            raise ConfigError(
                f"prompt {prompt.uid} has images but model.path is a text-only model; use a "
                "vision-language model (model=tiny-vl, or a Qwen2-VL directory or hub id)"
            )
        if self.episodes is not None:
            raise ConfigError(
                "prompts with images are single-turn only; set task.env.name=null with a "
                "task whose prompts carry images"
            )
        if prompt.pixels is not None:
            return prompt
        return dataclasses.replace(prompt, pixels=self.images.pixels(prompt))

    def generate(
        self, prompts: list[Prompt], sampling: SamplingParams, seed: int | None = None
    ) -> list[RolloutGroup]:
        """One group of ``sampling.n`` decoded, not yet scored, samples per prompt."""
        prompts, prompt_ids = self.encode(prompts)
        if not prompts:
            return []
        if self.episodes is not None:
            completions = self.episodes.run(
                prompts,
                prompt_ids,
                sampling,
                lambda ids, params, budgets: self.generate_fn(ids, params, seed, budgets),
            )
        else:
            images = pixels_of(prompts)
            extra = () if images is None else (images,)
            completions = self.generate_fn(prompt_ids, sampling, seed, None, *extra)
        return self.build_groups(prompts, prompt_ids, completions)

    def demonstration(self, prompt: Prompt) -> tuple[list[int], list[int]]:
        """SFT target of ``prompt``: response token ids (ending in EOS) and their loss mask
        (0 on environment tokens of a multi-turn demonstration)."""
        eos = self.tokenizer.eos_token_id
        if self.episodes is None:
            ids = self.tokenizer.encode(prompt.answer, add_special_tokens=False) + [eos]
            return ids, [1] * len(ids)
        parts = self.episodes.factory.demonstration(prompt)
        ids, mask = self.episodes.turns.demonstration(prompt, parts)  # in the run's tool format
        return ids + [eos], mask + [1]

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
            own = c.prompt_ids if c.prompt_ids is not None else ids  # an agent's own prompt
            return Sample(
                prompt, own, c, self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
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
        """Fill in every sample's reward; a failing reward scores 0 and is counted."""
        samples = [(g.prompt, s) for g in groups for s in g.samples]
        if not samples:
            return
        outcomes = self.scorer.score([_item(p, s) for p, s in samples])
        for (_, sample), outcome in zip(samples, outcomes, strict=True):
            if outcome.error is not None:
                if not self.reward_errors:
                    log.warning(
                        "a reward failed (scored 0, counted in rollout/reward_errors; later "
                        "failures are not logged): %s",
                        outcome.error,
                    )
                self.reward_errors += max(1, outcome.errors)
            sample.reward, sample.correct = outcome.reward, outcome.correct
            sample.reward_components = outcome.components

    def collect(
        self, prompts: list[Prompt], sampling: SamplingParams, seed: int | None = None
    ) -> list[RolloutGroup]:
        """Generate and score."""
        groups = self.generate(prompts, sampling, seed)
        self.score(groups)
        return groups

    def evaluate(
        self, prompts: list[Prompt], max_new_tokens: int, group_by: str | None = None
    ) -> EvalResult:
        """Greedy accuracy on ``prompts`` (and per value of their metadata key ``group_by``;
        prompts without that key are left out of those figures)."""
        groups = self.collect(
            prompts, SamplingParams(n=1, greedy=True, max_new_tokens=max_new_tokens)
        )
        samples = [g.samples[0] for g in groups]
        by_value: dict[str, list[bool]] = {}
        for s in samples:
            if group_by is not None and group_by in s.prompt.meta:
                by_value.setdefault(str(s.prompt.meta[group_by]), []).append(s.correct)
        return EvalResult(
            accuracy=float(np.mean([s.correct for s in samples])) if samples else 0.0,
            mean_reward=float(np.mean([s.reward for s in samples])) if samples else 0.0,
            mean_response_tokens=float(np.mean([len(s.completion.token_ids) for s in samples]))
            if samples
            else 0.0,
            num_prompts=len(samples),
            accuracy_by={value: float(np.mean(right)) for value, right in sorted(by_value.items())},
        )


def check_group_by(key: str | None, prompts: list[Prompt]) -> None:
    """Refuse ``eval.group_by=key`` when none of the held-out ``prompts`` has that metadata key
    (every per-value figure would be missing without a word)."""
    if key is not None and not any(key in p.meta for p in prompts):
        raise ConfigError(
            f"eval.group_by={key!r}: no held-out prompt has that metadata key; name one "
            "they have (the arithmetic task's is level) or set eval.group_by=null"
        )


def _item(prompt: Prompt, sample: Sample) -> tuple[str, str, dict]:
    """What a reward sees: the prompt text, the completion text (multi-turn: the whole
    transcript) and the prompt's metadata with the answer (and the environment's reward,
    verdict and turn count)."""
    metadata = {**prompt.meta, "answer": prompt.answer}
    episode = sample.completion.episode
    if episode is not None:
        metadata.update(env_reward=episode.reward, env_correct=episode.correct, turns=episode.turns)
    return prompt.text, sample.text, metadata
