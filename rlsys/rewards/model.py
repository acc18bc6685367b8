"""Reward-model scoring from the driver: one ``RewardModelWorker`` actor per
``reward.model.paths`` entry, scoring in parallel, their scores combined per item by
``reward.model.ensemble`` (mean | min)."""

from __future__ import annotations

import contextlib

import numpy as np
import ray

from rlsys.config.errors import ConfigError
from rlsys.config.reward import RewardModelConfig
from rlsys.placement import ActorResources
from rlsys.workers.calls import get_all
from rlsys.workers.reward_model import RewardModelWorker

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
        """Start one actor per ``cfg.paths`` entry (``threads``: torch threads per actor,
        default ``cfg.num_cpus``; ``chat``: render pairs with the reward model's chat template
        when it has one, as for ``task.chat_template=true``; ``resources``: the placement's request
        per actor, overriding ``cfg``'s) and wait until all have loaded."""
        if not cfg.paths:
            raise ConfigError(
                "reward.model.paths is empty; list one or more sequence-classification "
                "reward models (local HF directories or hub ids), e.g. reward.model.paths=[./rm]"
            )
        self.cfg, self.chat = cfg, chat
        res = resources or ActorResources(
            cfg.num_cpus, cfg.num_gpus, threads or max(1, int(cfg.num_cpus))
        )
        self.workers = [
            RewardModelWorker.options(**res.actor_options()).remote(
                path, cfg.dtype, cfg.batch_size, cfg.max_length, res.threads, res.num_gpus
            )
            for path in cfg.paths
        ]
        try:
            self._wait_loaded()
        except BaseException:
            self.shutdown()
            raise

    def _wait_loaded(self) -> None:
        failed = []
        for index, (path, worker) in enumerate(zip(self.cfg.paths, self.workers, strict=True)):
            try:
                ray.get(worker.ready.remote())
            except ray.exceptions.RayActorError as exc:
                failed.append(f"reward.model.paths[{index}]={path!r} ({_reason(exc)})")
        if failed:
            raise ConfigError(
                f"{'; '.join(failed)}: did not load as a reward model; pass local Hugging Face "
                "directories or hub ids of sequence-classification models "
                "(AutoModelForSequenceClassification)"
            )

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
        prompts_ref, completions_ref = ray.put(list(prompts)), ray.put(list(completions))
        scores = get_all(
            [w.score.remote(prompts_ref, completions_ref, self.chat) for w in self.workers]
        )
        combined = _COMBINE[self.cfg.ensemble](np.asarray(scores, dtype=np.float64), axis=0)
        return [float(s) for s in combined]

    def __call__(self, prompt: str, completion: str, metadata: dict) -> float:
        """The ensembled score of one pair (prefer ``score_batch``)."""
        return self.score_batch([prompt], [completion], [metadata])[0]

    def shutdown(self) -> None:
        """Kill the reward-model actors."""
        for worker in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(worker)
        self.workers = []


def _reason(exc: ray.exceptions.RayActorError) -> str:
    """The load error raised in the actor's constructor, without Ray's traceback."""
    text = str(exc)
    marker = "RewardModelLoadError: "
    if marker in text:
        return text[text.rindex(marker) + len(marker) :].strip().splitlines()[0]
    return text.strip().splitlines()[-1] if text.strip() else type(exc).__name__
