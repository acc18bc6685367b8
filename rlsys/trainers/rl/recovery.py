"""The controller's checkpoint and recovery side: its state, saving and restoring it, and
replacing worker processes that die.

A mixin of ``Controller`` (it uses the controller's pools, pipeline, buffer, sampler, recipe,
collector, totals and tracker), kept apart so ``controller.py`` reads like the algorithm.
Layout and behaviour: docs/checkpoints.md.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from pathlib import Path

import numpy as np

from rlsys.checkpoint import CheckpointError, read_trainer_state, step_of, write_trainer_state
from rlsys.faults import dead_actors, is_actor_failure

log = logging.getLogger(__name__)


class Recoverable:
    """Checkpoint, restore and recover a ``Controller`` (see the module docstring)."""

    def state_dict(self) -> dict:
        """Everything of the controller a resumed run needs (call between steps, with the
        buffer paused and drained or the pipeline not started)."""
        totals = dataclasses.replace(self.totals, train_wall_s=self._elapsed())
        return {
            "version": self.version,
            "totals": dataclasses.asdict(totals),
            "marks": [self._drawn, self._filtered],
            "buffer": self.buffer.state_dict(),
            "sampler": self.sampler.state_dict(),
            "pipeline": self.pipeline.state_dict(),
            "kl_coef": self.recipe.kl_coef,
            "collector": {
                "reward_errors": self.collector.reward_errors,
                "skipped_prompts": self.collector.skipped_prompts,
            },
            "rng": {"python": random.getstate(), "numpy": np.random.get_state()},
            "run_info": self.run_info,
        }

    def load_state_dict(self, state: dict) -> None:
        """Rebuild the run state of ``state`` (the pipeline must not be running)."""
        self._reset()
        self.version = state["version"]
        self.totals = dataclasses.replace(self.totals, **state["totals"])
        self._drawn, self._filtered = state["marks"]
        self.buffer.load_state_dict(state["buffer"])
        self.sampler.load_state_dict(state["sampler"])
        self.pipeline.load_state_dict(state["pipeline"])
        self.recipe.kl_coef = state["kl_coef"]
        self.collector.reward_errors = state["collector"]["reward_errors"]
        self.collector.skipped_prompts = state["collector"]["skipped_prompts"]
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        self.run_info = {**state["run_info"], **self.run_info}

    def save_checkpoint(self) -> Path:
        """Checkpoint after the latest step: waits for in-flight groups (the buffer must be
        paused), writes learners + controller state, then lets the feeder go on."""
        try:
            self.buffer.wait_drained()
            self.pipeline.raise_if_failed()
            state = self.state_dict()

            def write(tmp: Path) -> None:
                self.pools.learner.save_checkpoint(str(tmp / "policy"))
                if self.pools.critic is not None:
                    self.pools.critic.save_checkpoint(str(tmp / "critic"))
                if self.cfg.checkpoint.save_hf:
                    self.pools.learner.save_hf(str(tmp / "hf"))
                write_trainer_state(tmp, state)

            self._last_saved = self.checkpoints.save(self.totals.steps, write)
        finally:
            self.buffer.resume()
        return self._last_saved

    def restore(self, path: Path) -> None:
        """Load the checkpoint at ``path`` into the learners and the controller, and put its
        weights in the engines (before ``run``, or after a recovery stopped the pipeline)."""
        state = read_trainer_state(path)
        self.pools.learner.load_checkpoint(str(path / "policy"))
        if self.pools.critic is not None:
            self.pools.critic.load_checkpoint(str(path / "critic"))
        self.load_state_dict(state)
        self.pools.sync_weights(self.version)
        self.tracker.rewind(self.totals.steps)
        log.info("resumed from %s: step %d, policy version %d", path, step_of(path), self.version)

    def restore_newest(self, candidates: list[Path]) -> Path:
        """Restore the first of ``candidates`` (newest first) that loads; a damaged one falls
        back to the next. Raises CheckpointError when none loads."""
        for path in candidates:
            try:
                self.restore(path)
                return path
            except Exception as exc:  # noqa: BLE001 - any unreadable part: try an older one
                log.warning("checkpoint %s does not load (%s): trying the previous one", path, exc)
        raise CheckpointError(f"no checkpoint of {[str(p) for p in candidates]} loads; see above")

    def _replace_rollout_worker(self, worker: int, exc: BaseException) -> bool:
        """A rollout loop's generation call failed: if its worker process died, start a new
        one with the current weights (the loop then retries its request); False otherwise, or
        when the run is stopping (a recovery on the learner thread replaces it then)."""
        if not is_actor_failure(exc):
            return False
        with self._weights_lock:  # the learner is not mid-update: its weights are self.version
            if self.pipeline.gate.stopped:
                return False
            self.restarts.count("rollout", self.cfg.fault.max_rollout_restarts, exc)
            log.warning("rollout worker %d died (%s): restarting it", worker, exc)
            with self.pipeline.gate.shut():
                self.pools.replace_rollout_worker(worker)
                self.pools.sync_weights(self.version)
        return True

    def _recover(self, exc: Exception) -> bool:
        """A step failed in a worker process: replace the dead ones, go back to the latest
        checkpoint (or the start of the run) and go on. False for an error raised in this
        process (a bug or bad input: it stands). A failure no rollout worker explains counts
        as a learner restart, so a fault that repeats ends the run once
        ``fault.max_learner_restarts`` are used."""
        if not is_actor_failure(exc):
            return False
        self.pipeline.stop()
        self._drop_retired()
        learners_dead, rollout_dead = dead_actors(self.pools)
        latest = self.checkpoints.latest() if self.checkpoints is not None else None
        log.warning(
            "step %d failed (%s); %s; restoring %s",
            self.totals.steps + 1,
            exc,
            "a learner, critic or reference rank died"
            if learners_dead
            else f"rollout workers {rollout_dead} died"
            if rollout_dead
            else "no process died",
            latest or "the start of the run",
        )
        for worker in rollout_dead:
            self.restarts.count("rollout", self.cfg.fault.max_rollout_restarts, exc)
            self.pools.rollout.replace(worker)
        if learners_dead or not rollout_dead:
            self.restarts.count("learner", self.cfg.fault.max_learner_restarts, exc)
        if learners_dead or latest is None:  # fresh learners: dead ones, or weights to rewind
            self.pools.replace_learners()
            self._set_learning_rates()
        else:
            self.pools.connect_weight_sync()  # re-form the sync group the failure broke
        if latest is not None:
            self.restore(latest)
        else:
            self.load_state_dict(self._initial)
            self.pools.sync_weights(self.version)
            self.tracker.rewind(0)
        self.pipeline.start()
        return True
