"""The single controller: the RL algorithm over Ray worker pools, one knob for async.

Concurrent loops (``rlsys.pipeline``) feed prompts, generate on every rollout worker and score
groups as they finish, into the streaming buffer; this thread is the learner::

    repeat, on the pipeline's threads (never more than (max_staleness + 1) batches ahead):
        prompts <- sampler                                  (feeder, admission control)
        groups  <- rollout worker: n samples/prompt, policy v   (one loop per worker)
        groups  <- reward function; filter; overlong shaping; reference logprobs  (scoring)
        buffer  <- groups, stamped with the version that generated them
    each step, on this thread:
        batch    <- buffer (groups > max_staleness versions old are dropped)
        old_lp   <- learner forward before the update, when needed  (learner_logprobs)
        weights  <- off-policy correction from behaviour vs old_lp
        values   <- critic forward, if gae                       (critic_values)
        adv      <- advantage estimator(rewards, KL, values, ReMax baseline)
        learner  <- policy update (PPO clip / GSPO / vanilla)    (train)
        critic   <- value regression onto the returns            (critic_train)
        gate shut: v += 1; engines <- weights v; eval            (weight_sync)
    every checkpoint.every steps, at exit and on SIGTERM: feeder paused, in-flight groups
        drained, learners + controller state saved          (recovery.py)
    a worker process dies: replace it; a rollout request is retried, a failed step goes
        back to the latest checkpoint                         (recovery.py)
    after a step, if asked (*.elastic.schedule, `rlsys scale`): restart the learner group
        at N ranks from a checkpoint                          (learner_scaling.py);
        add rollout workers (weights v first) or retire some after their requests  (scaling.py)

``buffer.max_staleness=0`` is synchronous on-policy training: the next batch is issued only
once the new weights are in the engines. ``1`` overlaps the next batch's generation with
this step's training (one-step-off); more is fully asynchronous.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np

from rlsys.algorithms.recipe import Recipe
from rlsys.algorithms.traits import uses_critic
from rlsys.checkpoint.store import CheckpointStore
from rlsys.config.elastic import RESIZABLE_GROUPS
from rlsys.config.schema import TrainConfig
from rlsys.data.collate import samples_to_batch
from rlsys.data.tasks import TaskSplits
from rlsys.run.tracking import Tracker
from rlsys.trainers.collector import RolloutCollector
from rlsys.trainers.rl.evaluation import HeldOut
from rlsys.trainers.rl.group_structure import group_structure
from rlsys.trainers.rl.handover import MemoryHandover
from rlsys.trainers.rl.learner_scaling import LearnerScaler
from rlsys.trainers.rl.recovery import Recovery
from rlsys.trainers.rl.rollout_metrics import rollout_metrics
from rlsys.trainers.rl.roofline import Roofline
from rlsys.trainers.rl.run_parts import RunParts
from rlsys.trainers.rl.run_summary import run_summary
from rlsys.trainers.rl.sample_metrics import sample_rows
from rlsys.trainers.rl.scale_requests import ScalePlan, live_check
from rlsys.trainers.rl.scaling import RolloutScaler
from rlsys.trainers.rl.selection import BestPolicy
from rlsys.trainers.rl.state import RunState
from rlsys.trainers.rl.step_metrics import batch_metrics, learner_padding, perf_metrics
from rlsys.trainers.rl.timing import StageTimer, setup_frozen
from rlsys.trainers.rl.updates import LearnerUpdates
from rlsys.types import RolloutGroup, SamplingParams, TrainBatch
from rlsys.workers.pools import Pools

log = logging.getLogger(__name__)


class Controller:
    """Drives the pools through ``trainer.total_steps`` RL steps (fewer if a budget ends
    the run). ``run_dir`` is where ``rlsys scale`` leaves resize requests (None: only the
    schedules resize the pools)."""

    def __init__(
        self,
        cfg: TrainConfig,
        pools: Pools,
        tokenizer,
        task: TaskSplits,
        tracker: Tracker,
        checkpoints: CheckpointStore | None = None,
        run_info: dict | None = None,
        run_dir: Path | None = None,
    ) -> None:
        self.cfg, self.pools, self.tracker, self.task = cfg, pools, tracker, task
        self.checkpoints = checkpoints  # None: no checkpoints (and no learner recovery from one)
        self.run_info = dict(run_info or {})  # saved in checkpoints (model path, tracker run id)
        algo = cfg.algorithm
        if uses_critic(algo) and pools.critic is None:
            raise ValueError("algorithm.advantage=gae needs a critic pool (start_pools roles)")
        if cfg.reference_group and pools.reference is None:
            raise ValueError("algorithm.kl_coef > 0 needs a reference pool (start_pools roles)")
        self.collector = RolloutCollector.for_task(
            pools.generate, tokenizer, cfg.task, cfg.reward, pools.scorer
        )
        self.held_out = HeldOut(cfg, task, self.collector)
        self.best = BestPolicy.for_run(
            self.held_out.validation,
            checkpoints,
            lambda path: pools.learner.save_hf(path),  # late-bound: a resize replaces it
        )
        episodes = self.collector.episodes
        self.recipe = Recipe(
            algo,
            cfg.rollout.n_samples,
            task.max_new_tokens
            if episodes is None
            else episodes.total_tokens(task.max_new_tokens),  # a trajectory's bound
        )
        self.sampling = SamplingParams(
            n=cfg.rollout.n_samples,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            max_new_tokens=task.max_new_tokens,
        )
        self.pad_id = tokenizer.pad_token_id
        self.preempt = threading.Event()  # set (by a SIGTERM handler): checkpoint and stop
        self.parts = RunParts(
            cfg,
            task.train,
            pools,
            self.collector,
            self.sampling,
            self.recipe.shape_rewards,
            self._reference_logprobs if algo.uses_reference else None,
            # late-bound: Recovery is built on the state these parts go into
            replace_worker=lambda worker, exc: self.recovery.replace_rollout_worker(worker, exc),
            pad_id=self.pad_id,
        )
        self.state = RunState(*self.parts.build())
        self.handover = MemoryHandover(pools, self.state, cfg.engines_sleep)
        self.updates = LearnerUpdates(cfg, pools, self.state, self.recipe, checkpoints)
        self.scale_plan = ScalePlan(
            {key: getattr(cfg, key).elastic.schedule for key in ("rollout", *RESIZABLE_GROUPS)},
            run_dir,
            check=live_check(cfg, pools),  # a request the cluster cannot hold is dropped
        )
        self.scaler = RolloutScaler(
            cfg.rollout.elastic,
            pools,
            self.state,
            cfg.buffer.max_staleness,
            unmet=self.scale_plan.unmet,
        )
        self.recovery = Recovery(
            cfg,
            pools,
            self.state,
            checkpoints=checkpoints,
            tracker=tracker,
            recipe=self.recipe,
            collector=self.collector,
            scaler=self.scaler,
            run_info=self.run_info,
            reset=lambda: self.state.reset(*self.parts.build()),
            new_learners=self.updates.set_learning_rates,
        )
        self.learner_scaler = LearnerScaler(
            cfg, pools, self.state, self.recovery, self.updates.set_learning_rates
        )
        self.updates.set_learning_rates()
        self.roofline = Roofline.for_run(cfg, pools) if cfg.tracking.roofline else None

    # ---- the algorithm -------------------------------------------------------------------

    def step(
        self, step: int, evaluate: bool = False, hold: bool = False
    ) -> dict[str, float] | None:
        """One learner step on the next batch the pipeline delivers (and an evaluation after
        the weight update if ``evaluate``); returns its metrics, or None when the sample
        budget is spent and nothing is left to train on. ``hold`` leaves the buffer paused
        (no new prompts issued) for a checkpoint.

        Consumes: a batch of groups from the buffer. Produces: a new policy version in the
        engines. Waits for: a full batch (or for nothing more to be able to arrive), then for
        running requests at the gate. Unblocked by: the scoring loop queuing groups; rollout
        requests returning (at once when partial rollouts abort them)."""
        timer = StageTimer()
        started = time.perf_counter()
        kept = self._take_batch(step, timer)
        if kept is None:
            return None
        metrics = self._observe_rollouts(step, kept)
        moved = False
        # colocated engines sleep through the update and wake in stages around the sync:
        # the rollout loops stay held from the sleep to the last stage
        with self.state.weights_lock, self.handover.held():
            if kept:
                moved = self._learn(step, kept, metrics, timer)
            metrics.update(self._publish(moved, evaluate, timer))
        if hold:
            self.state.buffer.pause()
        self.state.buffer.step_done(self.state.version)
        metrics = perf_metrics(metrics, timer.seconds, time.perf_counter() - started)
        return self.roofline.add(metrics) if self.roofline else metrics

    def _take_batch(self, step: int, timer: StageTimer) -> list[RolloutGroup] | None:
        """The next batch of groups the buffer releases (fewer with dynamic sampling), or None
        when the sample budget is spent and nothing is left to train on."""
        with timer("wait_for_batch"):
            kept = self.state.buffer.take(self.cfg.data.batch_size)
        self.state.pipeline.raise_if_failed()
        if not kept and self.state.buffer.exhausted():
            return None
        if self.cfg.algorithm.dynamic_sampling and len(kept) < self.cfg.data.batch_size:
            log.warning(
                "step %d: only %d of data.batch_size=%d groups had reward variance within "
                "algorithm.max_sampling_rounds=%d (or trainer.max_samples); training on those",
                step,
                len(kept),
                self.cfg.data.batch_size,
                self.cfg.algorithm.max_sampling_rounds,
            )
        return kept

    def _observe_rollouts(self, step: int, kept: list[RolloutGroup]) -> dict[str, float]:
        """At the step boundary: the groups scored since the last step reach the prompt
        sampler and the replay store; returns the rollout and batch metrics (and writes the
        sample table when due)."""
        groups, penalties, reference_s = self.state.pipeline.scoring.drain_window()
        self.state.sampler.observe(groups)  # at the step boundary: see rlsys.data.curriculum
        if self.state.pipeline.replay is not None:  # likewise: see rlsys.buffer.replay
            self.state.pipeline.replay.commit(self.state.version)
        window = (groups, penalties, reference_s)
        overlong = bool(self.recipe.overlong_buffer)
        metrics, counts = rollout_metrics(
            self.cfg, self.state, self.pools, self.collector, overlong, window
        )
        self.state.drawn, self.state.filtered = counts
        samples = [s for g in groups for s in g.samples]
        self.state.totals.samples += len(samples)
        self.state.totals.response_tokens += sum(len(s.completion.token_ids) for s in samples)
        metrics.update(
            batch_metrics(
                kept, self.state.buffer, self.state.version, self.cfg.buffer.max_staleness
            )
        )
        if kept and self.tracker.samples_due(step):
            self.tracker.log_samples(step, sample_rows(kept, self.cfg.tracking.sample_table_rows))
        return metrics

    def _learn(
        self, step: int, kept: list[RolloutGroup], metrics: dict[str, float], timer: StageTimer
    ) -> bool:
        """The algorithm on one batch, engines asleep where they share the learners' devices:
        the learner's log-probabilities before the update and the off-policy weights, the KL
        to the reference, the critic's values, the advantages, then the update. Adds its
        metrics to ``metrics``; returns whether the policy moved."""
        batch = samples_to_batch([s for g in kept for s in g.samples], self.pad_id)
        metrics["train/overlong_filtered"] = self.recipe.filter_overlong(batch, kept)
        metrics["perf/padding_frac"] = learner_padding(batch, self.cfg.learner)
        with self.handover.engines_asleep(timer, metrics):
            if self.updates.needs_old_logprobs(batch):
                with timer("learner_logprobs"):
                    batch.old_logprobs = self.pools.learner.forward_logprobs(batch)
                metrics.update(self.recipe.off_policy_weights(batch))
            token_kl = self.recipe.token_kl(batch) if batch.ref_logprobs is not None else None
            if self.pools.critic is not None:
                with timer("critic_values"):
                    batch.values = self.pools.critic.forward_values(batch)
            structure = group_structure(kept, self.cfg.algorithm.advantage)
            adv = self.recipe.advantages(batch, token_kl, **structure)
            batch.advantages, batch.returns = adv.advantages, adv.returns
            if self.roofline:
                self.roofline.observe(batch, self.updates.skipped_rows(batch))
            update, moved = self.updates.update(step, batch, token_kl, timer)
        metrics.update(update)
        return moved

    def _publish(self, moved: bool, evaluate: bool, timer: StageTimer) -> dict[str, float]:
        """With the rollout loops held between requests: a policy that changed becomes the
        next version and goes to the engines; then the evaluation, if asked for."""
        metrics: dict[str, float] = {}
        if not (moved or evaluate or self.handover.kv_cache_asleep):
            return metrics
        with self.state.pipeline.gate.shut() as waited_s:
            timer.seconds["gate_wait"] = waited_s
            if moved:
                self.state.version += 1
                with timer("weight_sync"):
                    sent = self.pools.sync_weights(self.state.version)
                metrics["perf/weight_sync_bytes"] = float(sent.num_bytes)
            metrics.update(self.handover.wake_kv_cache(timer))
            if evaluate:
                metrics.update(self._timed_evaluate())
        return metrics

    def _timed_evaluate(self) -> dict[str, float]:
        start = time.perf_counter()
        metrics = self.held_out.evaluate()
        metrics["time/eval"] = time.perf_counter() - start
        self.state.totals.eval_s += metrics["time/eval"]
        return metrics

    def run(self, final: Path | None = None) -> dict:
        """Evaluate (unless resumed); train until ``trainer.total_steps``, a budget or a
        SIGTERM (evaluating every K steps and at the end, keeping the policy of the best
        validation accuracy in checkpoints/best with ``eval.validation_prompts``,
        checkpointing every ``checkpoint.every`` steps and at exit); export the policy to
        ``final`` unless stopped by SIGTERM; check and report the sample accounting. A rank
        that dies in any of it sends the run back to its latest checkpoint
        (``recovery.py``)."""
        first = None
        if self.state.totals.accuracy_before is None:
            first = self._timed_evaluate()
            self.state.totals.accuracy_before = self._log_eval(0, first)
            self.state.totals.eval_s = 0.0
            self.state.clock = time.perf_counter()
        self.recovery.mark_start()
        with setup_frozen():
            self.state.pipeline.start()
            try:
                if first is not None and self.best is not None:
                    self.best.start_over()  # a best left by a run this one starts over from
                    self._keep_if_best(0, first)  # a rank died in it: back at the start
                while True:  # again after a rank died in the last saves (recovery.finish)
                    self._train_loop()
                    steps = self.state.totals.steps
                    if self.preempt.is_set():
                        log.warning("SIGTERM: stopping after step %d", steps)
                    elif self.state.totals.eval_history[-1]["step"] != steps:
                        with self.state.pipeline.gate.shut():
                            last = self._timed_evaluate()
                        self._log_eval(steps, last)
                        if not self._keep_if_best(steps, last):
                            continue  # back at the latest checkpoint: train on from it
                    final = None if self.preempt.is_set() else final
                    if self.recovery.finish(self.cfg.checkpoint.at_exit, final):
                        break
            finally:
                self.state.pipeline.stop()
        self.state.pipeline.raise_if_failed()
        accounting = self.state.buffer.accounting()
        if not accounting["balanced"]:
            log.error("sample accounting does not balance (a bug; please report): %s", accounting)
        summary = run_summary(
            self.cfg,
            self.state,
            len(self.task.eval),
            self.collector,
            self.recovery,
            self.preempt.is_set(),
            self.state.elapsed(),
            accounting,
        )
        if self.best is not None:  # eval.validation_prompts: the policy it chose, if any yet
            summary.update(self.best.summary())
        return {**summary, "final_model": str(final) if final else None}

    def _train_loop(self) -> None:
        trainer, every = self.cfg.trainer, self.cfg.checkpoint.every
        while self.state.totals.steps < trainer.total_steps and not self.preempt.is_set():
            step = self.state.totals.steps + 1
            evaluate = step == trainer.total_steps or bool(
                trainer.eval_every and step % trainer.eval_every == 0
            )
            save = self.checkpoints is not None and bool(every) and step % every == 0
            try:
                metrics = self.step(step, evaluate, hold=save)
            except Exception as exc:
                if not self.recovery.recover(exc):
                    raise
                continue
            if metrics is None:
                log.info("trainer.max_samples=%s issued and used: stopping", trainer.max_samples)
                return
            self.state.totals.steps = step
            if evaluate:
                self.state.totals.eval_history.append({"step": step, **metrics})
            self.tracker.log(step, metrics)
            if evaluate and not self._keep_if_best(step, metrics):
                continue  # a rank died in the export: back at the latest checkpoint
            if save and not self.recovery.checkpoint_or_recover():
                continue  # a rank died in the save: back at the latest checkpoint
            wanted = self.scale_plan.poll(step)
            self.learner_scaler.after_step(step, wanted)
            self.scaler.after_step(step, wanted.get("rollout"), metrics)
            stop = self._budget_spent(self.state.elapsed())
            if stop and step < trainer.total_steps:
                log.warning("%s reached at step %d: stopping", stop, step)
                return

    # ---- helpers ---------------------------------------------------------------------------

    def _budget_spent(self, elapsed_s: float) -> str | None:
        """The wall-clock budget that ends the run early, if it is spent (the sample budget
        ends it when the buffer runs dry)."""
        limit = self.cfg.trainer.max_wall_s
        if limit and elapsed_s > limit:
            return f"trainer.max_wall_s={limit}"
        return None

    def _reference_logprobs(self, batch: TrainBatch) -> np.ndarray:
        if self.cfg.reference_from_learner:  # the base model: the learner with adapters off
            return self.pools.learner.forward_base_logprobs(batch)
        return self.pools.reference.forward_logprobs(batch)

    def _log_eval(self, step: int, metrics: dict[str, float]) -> float:
        self.state.totals.eval_history.append({"step": step, **metrics})
        self.tracker.log(step, metrics)
        return metrics["eval/accuracy"]

    def _keep_if_best(self, step: int, metrics: dict[str, float]) -> bool:
        """With ``eval.validation_prompts``: the policy exported to checkpoints/best if this
        evaluation's validation accuracy is the best yet (the learner holds the weights just
        evaluated: an evaluation follows the weight sync, and nothing trains before this).
        False when a rank died in the export and the run went back to its latest
        checkpoint (``recovery.recover``), as a failed save does."""
        best = self.best
        return best is None or self.recovery.attempt(lambda: best.consider(step, metrics))
