"""The single controller: the RL algorithm, step by step, over Ray worker pools.

One step (synchronous, ``buffer.max_staleness=0``)::

    repeat (once; with dynamic sampling until data.batch_size groups have signal):
        prompts <- sampler                                 (data)
        groups  <- rollout pool: n samples/prompt, policy v (generation)
        groups  <- reward function (+ overlong shaping)     (scoring)
        buffer  <- groups (stale / no-signal groups dropped)
    batch    <- buffer
    baseline <- greedy reply per prompt, scored, if remax   (baseline)
    ref_lp   <- reference worker, if any KL term            (reference)
    old_lp   <- learner forward before the update          (learner_logprobs)
    values   <- critic forward, if gae                      (critic_values)
    adv      <- advantage estimator(rewards, KL penalty, values, baseline)
    learner  <- policy update (PPO clip / GSPO / vanilla)   (train)
    critic   <- value regression onto the returns           (critic_train)
    v += 1; engines <- learner weights as version v       (weight_sync)
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlsys.algorithms.names import NEEDS_GREEDY_BASELINE
from rlsys.algorithms.objectives import ValueObjective
from rlsys.algorithms.recipe import Recipe
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
        algo = cfg.algorithm
        self.buffer = StreamingBuffer(
            cfg.buffer.max_staleness,
            has_reward_variance if algo.filter_uniform_groups else None,
        )
        self.recipe = Recipe(algo, cfg.rollout.n_samples, task.max_new_tokens)
        if algo.uses_critic and pools.critic is None:
            raise ValueError("algorithm.advantage=gae needs a critic pool (start_pools roles)")
        if algo.uses_reference and pools.reference is None:
            raise ValueError("algorithm.kl_coef > 0 needs a reference pool (start_pools roles)")
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
        groups, metrics = self._collect(step, timer)
        kept = self.buffer.take(self.cfg.data.batch_size, self.version)
        metrics["buffer/groups_kept"] = len(kept)
        metrics["buffer/groups_surplus"] = len(self.buffer)  # dynamic sampling's extra groups
        if kept:
            batch = samples_to_batch([s for g in kept for s in g.samples], self.pad_id)
            metrics["train/overlong_filtered"] = self.recipe.filter_overlong(batch, kept)
            baseline = None
            if self.cfg.algorithm.advantage in NEEDS_GREEDY_BASELINE:
                with timer("baseline"):
                    baseline = self._greedy_baseline(kept, step)
            if self.pools.reference is not None:
                with timer("reference"):
                    batch.ref_logprobs = self._reference_logprobs(batch)
            with timer("learner_logprobs"):
                batch.old_logprobs = self.pools.learner.forward_logprobs(batch)
            token_kl = self.recipe.token_kl(batch) if self.pools.reference is not None else None
            if self.pools.critic is not None:
                with timer("critic_values"):
                    batch.values = self.pools.critic.forward_values(batch)
            adv = self.recipe.advantages(batch, token_kl, baseline)
            batch.advantages, batch.returns = adv.advantages, adv.returns
            metrics.update(self._update(step, batch, token_kl, timer))
        return self._perf_metrics(metrics, timer, time.perf_counter() - started, groups)

    def _update(
        self, step: int, batch: TrainBatch, token_kl: np.ndarray | None, timer: StageTimer
    ) -> dict[str, float]:
        """Train the critic and (after its warm-up) the policy on ``batch``; a policy that
        changed becomes the next version and goes to the engines."""
        metrics: dict[str, float] = {}
        if self.pools.critic is not None:
            with timer("critic_train"):
                critic = self.pools.critic.train_step(
                    batch, ValueObjective(self.cfg.critic.value_clip), self._seed(step)
                )
            metrics.update({f"critic/{k}": v for k, v in critic.items()})
        if self._critic_warming_up(step):
            return metrics
        with timer("train"):
            train = self.pools.learner.train_step(
                batch, self.recipe.policy_objective(), self._seed(step)
            )
        metrics.update(self._train_metrics(train, batch, token_kl))
        if token_kl is not None:
            self.recipe.update_kl_coef(token_kl, batch.loss_mask)
        if train["trained_tokens"] > 0:  # every sample masked out: the policy did not move
            self.version += 1
            with timer("weight_sync"):
                self.pools.sync_weights(self.version)
        return metrics

    def _collect(self, step: int, timer: StageTimer) -> tuple[list[RolloutGroup], dict]:
        """Generate, score and buffer one batch of prompts' groups. With
        ``algorithm.dynamic_sampling`` (DAPO), keep drawing batches until the buffer holds
        ``data.batch_size`` groups with reward variance, or ``max_sampling_rounds`` are spent.

        The filter sees the verifier's rewards; overlong shaping is added after it (DAPO
        keeps groups by their correct-answer count, not by reply lengths)."""
        algo = self.cfg.algorithm
        rounds = algo.max_sampling_rounds if algo.dynamic_sampling else 1
        self.buffer.drop_stale(self.version)  # surplus groups of an earlier step
        filtered_before = self.buffer.stats.dropped_filtered
        generated: list[RolloutGroup] = []
        penalties = []
        used, out_of_budget = 0, False
        for used in range(1, rounds + 1):
            prompts = self.sampler.next_batch(self._refill_size(generated))
            with timer("generation"):
                groups = self.collector.generate(
                    prompts, self.sampling, seed=self._seed(step) + used - 1
                )
            with timer("scoring"):
                self.collector.score(groups)
                for group in groups:
                    self.buffer.put(group, self.version)
                penalties.append(self.recipe.shape_rewards([s for g in groups for s in g.samples]))
            generated += groups
            out_of_budget = self._sample_budget_spent(generated)
            if len(self.buffer) >= self.cfg.data.batch_size or out_of_budget:
                break
        if algo.dynamic_sampling and len(self.buffer) < self.cfg.data.batch_size:
            log.warning(
                "step %d: only %d of data.batch_size=%d groups had reward variance after %d "
                "sampling rounds (%s); training on those",
                step,
                len(self.buffer),
                self.cfg.data.batch_size,
                used,
                f"trainer.max_samples={self.cfg.trainer.max_samples} reached"
                if out_of_budget
                else f"algorithm.max_sampling_rounds={rounds}",
            )
        metrics = self._rollout_metrics(generated)
        metrics["rollout/sampling_rounds"] = used
        metrics["rollout/groups_filtered"] = (
            self.buffer.stats.dropped_filtered - filtered_before
        ) / self.cfg.rollout.n_samples
        if self.recipe.overlong_buffer:
            metrics["rollout/overlong_penalty"] = float(np.mean(penalties))
        return generated, metrics

    def _refill_size(self, generated: list[RolloutGroup]) -> int:
        """Prompts to draw next: a full batch first; then, for dynamic sampling, enough to fill
        the missing groups at this step's keep rate so far (at least 1 in 10 assumed), capped
        at a batch, so little is generated only to be dropped as surplus."""
        batch = self.cfg.data.batch_size
        if not generated:
            return batch
        missing = batch - len(self.buffer)
        keep_rate = max(len(self.buffer) / len(generated), 0.1)
        return min(batch, math.ceil(missing / keep_rate))

    def _sample_budget_spent(self, generated: list[RolloutGroup]) -> bool:
        """Whether ``trainer.max_samples`` is reached counting this step's groups so far
        (dynamic sampling stops drawing then, so a run overshoots by at most one batch)."""
        budget = self.cfg.trainer.max_samples
        this_step = sum(len(g.samples) for g in generated)
        return budget is not None and self.totals.samples + this_step >= budget

    def _greedy_baseline(self, groups: list[RolloutGroup], step: int) -> np.ndarray:
        """ReMax's baseline: the (shaped) reward of each prompt's greedy reply, per sample."""
        greedy = SamplingParams(n=1, greedy=True, max_new_tokens=self.task.max_new_tokens)
        replies = self.collector.generate([g.prompt for g in groups], greedy, self._seed(step))
        self.collector.score(replies)
        self.recipe.shape_rewards([r.samples[0] for r in replies])
        rewards = {r.prompt.uid: r.samples[0].reward for r in replies}
        return np.array(
            [rewards[g.prompt.uid] for g in groups for _ in g.samples], dtype=np.float32
        )

    def _critic_warming_up(self, step: int) -> bool:
        """During ``critic.pretrain_steps`` only the critic learns."""
        return self.pools.critic is not None and step <= self.cfg.critic.pretrain_steps

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
        policy_steps = trainer.total_steps - (
            self.cfg.critic.pretrain_steps if self.pools.critic is not None else 0
        )
        optimizer_steps = policy_steps * learner.ppo_epochs * learner.num_mini_batches
        self.pools.learner.set_lr(learner.optim.lr, decay_steps=optimizer_steps)
        if self.pools.critic is not None:
            critic = self.cfg.critic
            self.pools.critic.set_lr(
                critic.optim.lr,
                decay_steps=trainer.total_steps * critic.ppo_epochs * critic.num_mini_batches,
            )
        before = self._log_eval(0)
        started = time.perf_counter()
        step = 0
        for step in range(1, trainer.total_steps + 1):
            metrics = self.step(step)
            self.totals.steps = step
            last = step == trainer.total_steps
            stop = None if last else self._budget_spent(time.perf_counter() - started)
            if last or stop or (trainer.eval_every and step % trainer.eval_every == 0):
                metrics.update(self.evaluate())
                self.totals.eval_history.append({"step": step, **metrics})
            self.tracker.log(step, metrics)
            if stop:
                log.warning("%s reached at step %d: stopping", stop, step)
                break
        wall = time.perf_counter() - started
        after = (
            self.totals.eval_history[-1]["eval/accuracy"] if self.totals.eval_history else before
        )
        return self._summary(before, after, wall)

    # ---- helpers ---------------------------------------------------------------------------

    def _budget_spent(self, elapsed_s: float) -> str | None:
        """The ``trainer.*`` budget that ends the run early, if one is spent."""
        trainer = self.cfg.trainer
        if trainer.max_wall_s and elapsed_s > trainer.max_wall_s:
            return f"trainer.max_wall_s={trainer.max_wall_s}"
        if trainer.max_samples and self.totals.samples >= trainer.max_samples:
            return f"trainer.max_samples={trainer.max_samples}"
        return None

    def _seed(self, step: int) -> int:
        return self.cfg.run.seed * 1_000_003 + step * 101

    def _reference_logprobs(self, batch: TrainBatch) -> np.ndarray:
        import ray

        return ray.get(self.pools.reference.forward_logprobs.remote(batch))

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

    def _train_metrics(
        self, train: dict[str, float], batch: TrainBatch, token_kl: np.ndarray | None
    ) -> dict[str, float]:
        out = {f"train/{k}": v for k, v in train.items()}
        mask = batch.loss_mask > 0
        # train/kl: per-token KL to the reference when there is one, else the update's drift.
        out["train/kl"] = train.get("approx_kl", 0.0)
        if token_kl is not None:
            trained = mask.any(-1)
            out["train/kl"] = float(token_kl[mask].mean()) if mask.any() else 0.0
            out["train/kl_ref_seq"] = (
                float(token_kl[trained].sum(-1).mean()) if trained.any() else 0.0
            )
            out["train/kl_coef"] = self.recipe.kl_coef
        if not mask.any():
            return out
        out["train/logprob_mismatch"] = float(
            np.abs(batch.behaviour_logprobs[mask] - batch.old_logprobs[mask]).mean()
        )
        out["train/advantage_abs"] = float(np.abs(batch.advantages[mask]).mean())
        if batch.returns is not None:
            out["critic/return_mean"] = float(batch.returns[mask].mean())
            out["critic/value_mean_before"] = float(batch.values[mask].mean())
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
