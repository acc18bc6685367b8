"""Reward-model scoring from the driver: one inference-only learner group per
``reward.model.paths`` entry (``reward.model.world_size`` ranks, the model sharded over them
like a learner's), scoring in parallel, their scores combined per item by
``reward.model.ensemble`` (mean | min). The pairs are tokenized here, with each model's own
tokenizer."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import ray

from rlsys.config.errors import ConfigError
from rlsys.config.reward import RewardModelConfig
from rlsys.models.reward_model import RewardModelLoadError, encode_pairs, reward_tokenizer
from rlsys.placement.resources import ActorResources
from rlsys.workers.learner import LearnerGroup

_COMBINE = {"mean": np.mean, "min": np.min}


class RewardModelScorer:
    """Scores batches of (prompt, completion) with the reward model(s) in ``cfg``; a batch
    reward in the sense of ``rlsys.rewards.registry`` (``score_batch``). Ray must be up."""

    def __init__(
        self,
        cfg: RewardModelConfig,
        threads: int | None = None,
        chat: bool = False,
        resources: ActorResources | None = None,
    ) -> None:
        """Start one group per ``cfg.paths`` entry, all at once (``threads``: torch threads
        per rank, default ``cfg.num_cpus``; ``chat``: render pairs with the reward model's
        chat template when it has one, as for ``task.chat_template=true``; ``resources``:
        the placement's request per rank, overriding ``cfg``'s) and wait until all have
        loaded."""
        if not cfg.paths:
            raise ConfigError(
                "reward.model.paths is empty; list one or more sequence-classification "
                "reward models (local HF directories or hub ids), e.g. reward.model.paths=[./rm]"
            )
        self.cfg, self.chat = cfg, chat
        self._pool: ThreadPoolExecutor | None = None
        self.resources = resources or ActorResources(
            cfg.num_cpus, cfg.num_gpus, threads or max(1, int(cfg.num_cpus))
        )
        self.tokenizers = self._tokenizers()
        self.groups: list[LearnerGroup] = []
        with ThreadPoolExecutor(len(cfg.paths), thread_name_prefix="reward-model") as pool:
            futures = [pool.submit(self._start, i) for i in range(len(cfg.paths))]
        started = [f.result() if f.exception() is None else f.exception() for f in futures]
        self.groups = [g for g in started if isinstance(g, LearnerGroup)]
        failed = [g for g in started if not isinstance(g, LearnerGroup)]
        if failed:
            self.shutdown()
            errors = [g for g in failed if isinstance(g, BaseException)]
            if errors:
                raise errors[0]
            raise _not_loaded(failed)
        self._pool = ThreadPoolExecutor(len(self.groups), thread_name_prefix="reward-model")

    def _where(self, index: int, reason: str) -> str:
        return f"reward.model.paths[{index}]={self.cfg.paths[index]!r} ({reason})"

    def _tokenizers(self) -> list:
        """Every entry's tokenizer, loaded here before any actor starts (a typo in a path
        fails in a second); every entry that has none is named."""
        tokenizers, failed = [], []
        for index, path in enumerate(self.cfg.paths):
            try:
                tokenizers.append(reward_tokenizer(path))
            except RewardModelLoadError as exc:
                failed.append(self._where(index, str(exc)))
        if failed:
            raise _not_loaded(failed)
        return tokenizers

    def _start(self, index: int) -> LearnerGroup | str:
        """The group of entry ``index``, or why it did not load."""
        try:
            return LearnerGroup(
                self.cfg.group(),
                self.resources.shifted(index * self.cfg.world_size),  # its own GPU slots
                self.cfg.paths[index],
                self.cfg.dtype,
                1.0,
                role="reward",
                trainable=False,
            )
        except ray.exceptions.RayError as exc:
            return self._where(index, _reason(exc))

    @property
    def batch_size(self) -> int:
        """Items per ``score_batch`` call the reward scorer makes (each with its timeout)."""
        return self.cfg.batch_size

    def score_batch(
        self, prompts: list[str], completions: list[str], metadatas: list[dict]
    ) -> list[float]:
        """One ensembled score per (prompt, completion); ``metadatas`` is unused."""
        if not len(prompts) == len(completions) == len(metadatas):
            raise ValueError(
                f"score_batch got {len(prompts)} prompts, {len(completions)} completions and "
                f"{len(metadatas)} metadatas; pass one of each per sample"
            )
        if not prompts:
            return []
        batches = [
            encode_pairs(tok, list(prompts), list(completions), self.chat, self.cfg.max_length)
            for tok in self.tokenizers
        ]
        scores = list(self._pool.map(LearnerGroup.forward_scores, self.groups, batches))
        combined = _COMBINE[self.cfg.ensemble](np.asarray(scores, dtype=np.float64), axis=0)
        return [float(s) for s in combined]

    def __call__(self, prompt: str, completion: str, metadata: dict) -> float:
        """The ensembled score of one pair (prefer ``score_batch``)."""
        return self.score_batch([prompt], [completion], [metadata])[0]

    def shutdown(self) -> None:
        """Stop the reward-model groups."""
        for group in self.groups:
            with contextlib.suppress(Exception):
                group.shutdown(timeout_s=5.0)
        self.groups = []
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def _not_loaded(entries: list[str]) -> ConfigError:
    return ConfigError(
        f"{'; '.join(entries)}: did not load as a reward model; pass local Hugging Face "
        "directories or hub ids of sequence-classification models "
        "(AutoModelForSequenceClassification)"
    )


def _reason(exc: ray.exceptions.RayError) -> str:
    """The load error raised in a rank while it built its model, without Ray's traceback."""
    text = str(exc)
    marker = "RewardModelLoadError: "
    if marker in text:
        return text[text.rindex(marker) + len(marker) :].strip().splitlines()[0]
    return text.strip().splitlines()[-1] if text.strip() else type(exc).__name__
