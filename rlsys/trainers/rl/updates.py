"""The optimizer side of an RL step: the critic's and the policy's train steps on a batch,
their learning-rate schedules, and the count of steps whose optimizer skipped a non-finite
gradient. The controller hands it a batch with advantages; it answers with the update's
metrics and whether the policy moved."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from rlsys.algorithms.objectives import ValueObjective, inert_rows, needs_old_logprobs
from rlsys.algorithms.recipe import Recipe
from rlsys.checkpoint.store import CheckpointStore
from rlsys.config.schema import TrainConfig
from rlsys.trainers.rl.faults import nonfinite_streak
from rlsys.trainers.rl.state import RunState
from rlsys.trainers.rl.step_metrics import train_metrics
from rlsys.trainers.rl.timing import StageTimer
from rlsys.types import TrainBatch

if TYPE_CHECKING:
    from rlsys.workers.pools import Pools

log = logging.getLogger(__name__)


class LearnerUpdates:
    """Train steps of the policy learner (and the critic, when the algorithm has one) on the
    run's pools; ``checkpoints`` (None: none are kept) names the one a non-finite run falls
    back to."""

    def __init__(
        self,
        cfg: TrainConfig,
        pools: Pools,
        state: RunState,
        recipe: Recipe,
        checkpoints: CheckpointStore | None,
    ) -> None:
        self.cfg, self.pools, self.state, self.recipe = cfg, pools, state, recipe
        self.checkpoints = checkpoints

    def needs_old_logprobs(self, batch: TrainBatch) -> bool:
        """Whether this update needs a forward pass of its own before training (else the
        training pass's log-probabilities, detached, serve: see ``needs_old_logprobs``)."""
        learner = self.cfg.learner
        return needs_old_logprobs(
            learner.ppo_epochs,
            learner.num_mini_batches,
            self.cfg.algorithm.off_policy,
            batch.ref_logprobs is not None,
        )

    def skipped_rows(self, batch: TrainBatch) -> np.ndarray | None:
        """The rows of ``batch`` (with advantages) the policy's train step leaves out
        (``learner.skip_zero_advantage``), as the learner decides them; None: none."""
        if not self.cfg.learner.skip_zero_advantage:
            return None
        return inert_rows(self.recipe.policy_objective(), batch.advantages, batch.loss_mask)

    def update(
        self, step: int, batch: TrainBatch, token_kl: np.ndarray | None, timer: StageTimer
    ) -> tuple[dict[str, float], bool]:
        """Train the critic and (after its warm-up) the policy on ``batch``; returns the
        metrics and whether the policy changed."""
        metrics: dict[str, float] = {}
        if self.pools.critic is not None:
            with timer("critic_train"):
                critic = self.pools.critic.train_step(
                    batch, ValueObjective(self.cfg.critic.value_clip), self._seed(step)
                )
            metrics.update({f"critic/{k}": v for k, v in critic.items()})
        if self._critic_warming_up(step):
            return metrics, False
        with timer("train"):
            train = self.pools.learner.train_step(
                batch, self.recipe.policy_objective(), self._seed(step)
            )
        kl_coef = self.recipe.kl_coef if token_kl is not None else None
        metrics.update(train_metrics(train, batch, token_kl, kl_coef, self.state.version + 1))
        self._count_nonfinite(train.get("skipped_steps", 0.0), step)
        if token_kl is not None:
            self.recipe.update_kl_coef(token_kl, batch.loss_mask)
        return metrics, train["trained_tokens"] > 0  # all masked out: the policy did not move

    def set_learning_rates(self) -> None:
        """Peak rates and cosine horizons of the policy (and critic) optimizers."""
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

    def _count_nonfinite(self, skipped: float, step: int) -> None:
        """Count a step whose optimizer skipped a non-finite loss or gradient; stop the run
        after ``fault.max_nonfinite_steps`` of them in a row."""
        if not skipped:
            self.state.totals.nonfinite_run = 0
            return
        self.state.totals.nonfinite_steps += 1
        limit = self.cfg.fault.max_nonfinite_steps
        log.warning(
            "step %d: %d optimizer step(s) skipped for a non-finite loss or gradient norm "
            "(fault.max_nonfinite_steps=%d in a row stop the run)",
            step,
            int(skipped),
            limit,
        )
        latest = self.checkpoints.latest() if self.checkpoints is not None else None
        self.state.totals.nonfinite_run = nonfinite_streak(
            self.state.totals.nonfinite_run, skipped, limit, str(latest or "none saved yet")
        )

    def _critic_warming_up(self, step: int) -> bool:
        """During ``critic.pretrain_steps`` only the critic learns."""
        return self.pools.critic is not None and step <= self.cfg.critic.pretrain_steps

    def _seed(self, step: int) -> int:
        return self.cfg.run.seed * 1_000_003 + step * 101
