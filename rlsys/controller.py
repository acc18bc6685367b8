"""The single controller: the RL algorithm, step by step, over Ray worker pools.

One step (synchronous, ``buffer.max_staleness=0``)::

    prompts  <- sampler                                   (data)
    groups   <- rollout pool: n samples/prompt, policy v  (generation)
    groups   <- reward function on every sample           (scoring)
    batch    <- buffer (stale / no-signal groups dropped)
    ref_lp   <- reference worker, if algorithm.kl_coef>0  (reference)
    old_lp   <- learner forward before the update         (learner_logprobs)
    adv      <- advantage estimator(rewards)
    learner  <- clipped policy-gradient update            (train)
    v += 1; engines <- learner weights as version v       (weight_sync)
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlsys.algorithms.advantages import ADVANTAGES
from rlsys.algorithms.objectives import PolicyGradientObjective
from rlsys.buffer import StreamingBuffer, has_reward_variance
from rlsys.collector import RolloutCollector
from rlsys.config.schema import TrainConfig
from rlsys.data.collate import samples_to_batch
from rlsys.data.sampler import PromptSampler
from rlsys.data.tasks import TaskSplits
from rlsys.pools import Pools
from rlsys.tracking import Tracker
from rlsys.types import RolloutGroup, SamplingParams, TrainBatch

log = logging.getLogger(__name__)


class StageTimer:
    """Wall seconds per named stage of one step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str):
        start = time.perf_counter()
        yield
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start


@dataclass
class RunTotals:
    """Running totals for summary.json."""

    steps: int = 0
    samples: int = 0
    response_tokens: int = 0
    eval_history: list[dict] = field(default_factory=list)


class Controller:
    """Drives the pools through ``trainer.total_steps`` RL steps."""

    def __init__(
        self, cfg: TrainConfig, pools: Pools, tokenizer, task: TaskSplits, tracker: Tracker
    ) -> None:
        self.cfg, self.pools, self.tracker, self.task = cfg, pools, tracker, task
        self.version = 0
        self.sampler = PromptSampler(
            task.train, cfg.data.batch_size, cfg.data.shuffle, cfg.run.seed
        )
        self.collector = RolloutCollector.for_task(pools.generate, tokenizer, cfg.task)
        self.buffer = StreamingBuffer(
            cfg.buffer.max_staleness,
            has_reward_variance if cfg.algorithm.filter_uniform_groups else None,
        )
        algo = cfg.algorithm
        self.objective = PolicyGradientObjective(
            clip_low=algo.clip_eps,
            clip_high=algo.clip_eps_high or algo.clip_eps,
            kl_coef=algo.kl_coef,
            kl_estimator=algo.kl_estimator,
            entropy_coef=algo.entropy_coef,
        )
        self.advantage_fn = ADVANTAGES.get(algo.advantage)
        self.sampling = SamplingParams(
            n=cfg.rollout.n_samples,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            max_new_tokens=task.max_new_tokens,
        )
        self.pad_id = tokenizer.pad_token_id
        self.totals = RunTotals()

    # ---- the algorithm -------------------------------------------------------------------

    def step(self, step: int) -> dict[str, float]:
        """One synchronous RL step; returns its metrics."""
        timer = StageTimer()
        started = time.perf_counter()
        prompts = self.sampler.next_batch()
        with timer("generation"):
            groups = self.collector.generate(prompts, self.sampling, seed=self._seed(step))
        with timer("scoring"):
            self.collector.score(groups)
        metrics = self._rollout_metrics(groups)
        for group in groups:
            self.buffer.put(group, self.version)
        kept = self.buffer.take(len(groups), self.version)
        metrics["buffer/groups_kept"] = len(kept)
        if kept:
            batch = samples_to_batch([s for g in kept for s in g.samples], self.pad_id)
            if self.pools.reference is not None:
                with timer("reference"):
                    batch.ref_logprobs = self._reference_logprobs(batch)
            with timer("learner_logprobs"):
                batch.old_logprobs = self.pools.learner.forward_logprobs(batch)
            batch.advantages = self._advantages(kept)[:, None] * batch.loss_mask
            with timer("train"):
                train = self.pools.learner.train_step(batch, self.objective, self._seed(step))
            metrics.update(self._train_metrics(train, batch))
            self.version += 1
            with timer("weight_sync"):
                self.pools.sync_weights(self.version)
        return self._perf_metrics(metrics, timer, time.perf_counter() - started, groups)

    def evaluate(self) -> dict[str, float]:
        """Greedy accuracy on the held-out prompts with the engines' current weights."""
        result = self.collector.evaluate(
            self.task.eval[: self.cfg.eval.num_prompts],
            self.cfg.eval.max_new_tokens or self.task.max_new_tokens,
        )
        return {
            "eval/accuracy": result.accuracy,
            "eval/reward_mean": result.mean_reward,
            "eval/response_tokens": result.mean_response_tokens,
            "eval/num_prompts": result.num_prompts,
        }

    def run(self) -> dict:
        """Evaluate, train ``trainer.total_steps`` steps (evaluating every K), evaluate."""
        trainer, learner = self.cfg.trainer, self.cfg.learner
        optimizer_steps = trainer.total_steps * learner.ppo_epochs * learner.num_mini_batches
        self.pools.learner.set_lr(learner.optim.lr, decay_steps=optimizer_steps)
        before = self._log_eval(0)
        started = time.perf_counter()
        step = 0
        for step in range(1, trainer.total_steps + 1):
            metrics = self.step(step)
            self.totals.steps = step
            out_of_time = trainer.max_wall_s and time.perf_counter() - started > trainer.max_wall_s
            if (
                step == trainer.total_steps
                or out_of_time
                or (trainer.eval_every and step % trainer.eval_every == 0)
            ):
                metrics.update(self.evaluate())
                self.totals.eval_history.append({"step": step, **metrics})
            self.tracker.log(step, metrics)
            if out_of_time:
                log.warning(
                    "trainer.max_wall_s=%s reached at step %d: stopping", trainer.max_wall_s, step
                )
                break
        wall = time.perf_counter() - started
        after = (
            self.totals.eval_history[-1]["eval/accuracy"] if self.totals.eval_history else before
        )
        return self._summary(before, after, wall)

    # ---- helpers ---------------------------------------------------------------------------

    def _seed(self, step: int) -> int:
        return self.cfg.run.seed * 1_000_003 + step * 101

    def _reference_logprobs(self, batch: TrainBatch) -> np.ndarray:
        import ray

        return ray.get(self.pools.reference.forward_logprobs.remote(batch))

    def _advantages(self, groups: list[RolloutGroup]) -> np.ndarray:
        rewards = np.array([[s.reward for s in g.samples] for g in groups], dtype=np.float32)
        return self.advantage_fn(rewards, normalize_std=self.cfg.algorithm.normalize_std).reshape(
            -1
        )

    def _log_eval(self, step: int) -> float:
        metrics = self.evaluate()
        self.totals.eval_history.append({"step": step, **metrics})
        self.tracker.log(step, metrics)
        return metrics["eval/accuracy"]

    def _rollout_metrics(self, groups: list[RolloutGroup]) -> dict[str, float]:
        samples = [s for g in groups for s in g.samples]
        self.totals.samples += len(samples)
        tokens = sum(len(s.completion.token_ids) for s in samples)
        self.totals.response_tokens += tokens
        if not samples:
            return {}
        return {
            "rollout/reward_mean": float(np.mean([s.reward for s in samples])),
            "rollout/accuracy": float(np.mean([s.correct for s in samples])),
            "rollout/response_tokens": tokens / len(samples),
            "rollout/stop_frac": float(
                np.mean([s.completion.finish_reason == "stop" for s in samples])
            ),
            "rollout/reward_errors": float(self.collector.reward_errors),
        }

    def _train_metrics(self, train: dict[str, float], batch: TrainBatch) -> dict[str, float]:
        out = {f"train/{k}": v for k, v in train.items()}
        out["train/kl"] = train.get("kl_ref", train.get("approx_kl", 0.0))
        mask = batch.loss_mask > 0
        out["train/logprob_mismatch"] = float(
            np.abs(batch.behaviour_logprobs[mask] - batch.old_logprobs[mask]).mean()
        )
        out["train/advantage_abs"] = float(np.abs(batch.advantages[mask]).mean())
        out["policy/version"] = self.version + 1
        return out

    def _perf_metrics(
        self, metrics: dict, timer: StageTimer, step_s: float, groups: list[RolloutGroup]
    ) -> dict[str, float]:
        samples = sum(len(g.samples) for g in groups)
        tokens = sum(len(s.completion.token_ids) for g in groups for s in g.samples)
        metrics.update({f"time/{k}": v for k, v in timer.seconds.items()})
        metrics["perf/step_s"] = step_s
        metrics["perf/overhead_s"] = step_s - sum(timer.seconds.values())
        metrics["perf/samples_per_s"] = samples / step_s
        metrics["perf/tokens_per_s"] = tokens / step_s
        metrics["buffer/dropped_filtered"] = self.buffer.stats.dropped_filtered
        return metrics

    def _summary(self, before: float, after: float, wall: float) -> dict:
        return {
            "steps": self.totals.steps,
            "wall_s": wall,
            "samples": self.totals.samples,
            "samples_per_s": self.totals.samples / wall if wall else 0.0,
            "tokens_per_s": self.totals.response_tokens / wall if wall else 0.0,
            "eval_accuracy_before": before,
            "eval_accuracy_after": after,
            "eval_num_prompts": min(self.cfg.eval.num_prompts, len(self.task.eval)),
            "eval_history": [
                {"step": e["step"], "accuracy": e["eval/accuracy"]}
                for e in self.totals.eval_history
            ],
            "samples_dropped_filtered": self.buffer.stats.dropped_filtered,
            "samples_dropped_stale": self.buffer.stats.dropped_stale,
            "reward_errors": self.collector.reward_errors,
            "prompts_skipped_too_long": self.collector.skipped_prompts,
            "policy_version": self.version,
        }


def save_final_policy(pools: Pools, run_dir: Path) -> Path:
    """Export the trained policy as a Hugging Face directory under ``checkpoints/final``."""
    path = run_dir / "checkpoints" / "final"
    pools.learner.save_hf(str(path))
    return path
