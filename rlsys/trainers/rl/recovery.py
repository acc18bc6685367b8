"""The RL run's checkpoint and recovery side: saving and restoring the run state, and
replacing worker processes that die. Layout and behaviour: docs/checkpoints.md.

``Recovery`` owns what that needs (the checkpoint store, the restart counts, the state a
failure before any checkpoint goes back to) and works on the ``RunState`` it shares with
the controller; its other collaborators are passed in, so ``controller.py`` reads like the
algorithm.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rlsys.algorithms.recipe import Recipe
from rlsys.checkpoint.store import CheckpointError, CheckpointStore, step_of, write_trainer_state
from rlsys.config.schema import TrainConfig
from rlsys.run.tracking import Tracker
from rlsys.trainers.collector import RolloutCollector
from rlsys.trainers.rl.faults import Restarts, dead_actors, is_actor_failure
from rlsys.trainers.rl.saved_state import read_run_state
from rlsys.trainers.rl.scaling import RolloutScaler
from rlsys.trainers.rl.state import RunState
from rlsys.workers.pools import Pools

log = logging.getLogger(__name__)


class Recovery:
    """Checkpoint, restore and recover the run ``state`` (see the module docstring).

    ``reset`` gives ``state`` fresh parts (buffer, sampler, pipeline) before a restore;
    ``new_learners`` sets up learner groups started afresh (their learning rates)."""

    def __init__(
        self,
        cfg: TrainConfig,
        pools: Pools,
        state: RunState,
        *,
        checkpoints: CheckpointStore | None,
        tracker: Tracker,
        recipe: Recipe,
        collector: RolloutCollector,
        scaler: RolloutScaler,
        run_info: dict,
        reset: Callable[[], None],
        new_learners: Callable[[], None],
    ) -> None:
        self.cfg, self.pools, self.state = cfg, pools, state
        self.checkpoints = checkpoints  # None: no checkpoints (a failure rewinds to the start)
        self.tracker, self.recipe, self.collector, self.scaler = tracker, recipe, collector, scaler
        self.run_info = run_info  # saved in checkpoints (model path, tracker run id)
        self._reset, self._new_learners = reset, new_learners
        self.restarts = Restarts()
        self.last_saved: Path | None = None
        self._initial: dict | None = None  # what a failure before any checkpoint restores

    # ---- the run state ---------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything of the run a resumed one needs (call between steps, with the buffer
        paused and drained or the pipeline not started)."""
        state = self.state
        totals = dataclasses.replace(state.totals, train_wall_s=state.elapsed())
        return {
            "version": state.version,
            "totals": dataclasses.asdict(totals),
            "marks": [state.drawn, state.filtered],
            "buffer": state.buffer.state_dict(),
            "sampler": state.sampler.state_dict(),
            "pipeline": state.pipeline.state_dict(),
            "kl_coef": self.recipe.kl_coef,
            "collector": {
                "reward_errors": self.collector.reward_errors,
                "skipped_prompts": self.collector.skipped_prompts,
            },
            "rng": {"python": random.getstate(), "numpy": np.random.get_state()},
            "run_info": dict(self.run_info),
        }

    def load_state_dict(self, saved: dict) -> None:
        """Rebuild the run state of ``saved`` (the pipeline must not be running)."""
        self._reset()
        state = self.state
        state.version = saved["version"]
        state.totals = dataclasses.replace(state.totals, **saved["totals"])
        state.drawn, state.filtered = saved["marks"]
        state.buffer.load_state_dict(saved["buffer"])
        state.sampler.load_state_dict(saved["sampler"])
        state.pipeline.load_state_dict(saved["pipeline"])
        self.recipe.kl_coef = saved["kl_coef"]
        self.collector.reward_errors = saved["collector"]["reward_errors"]
        self.collector.skipped_prompts = saved["collector"]["skipped_prompts"]
        random.setstate(saved["rng"]["python"])
        np.random.set_state(saved["rng"]["numpy"])
        for key, value in saved["run_info"].items():  # this process's entries win
            self.run_info.setdefault(key, value)

    def mark_start(self) -> None:
        """Remember the state the run starts training from (a failure before the first
        checkpoint goes back to it)."""
        self._initial = self.state_dict()

    # ---- checkpoints -----------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        """Checkpoint after the latest step: waits for in-flight groups (the buffer must be
        paused), writes learners + run state, then lets the feeder go on."""
        buffer = self.state.buffer
        try:
            buffer.wait_drained()
            self.state.pipeline.raise_if_failed()
            state = self.state_dict()

            def write(tmp: Path) -> None:
                self.pools.learner.save_checkpoint(str(tmp / "policy"))
                if self.pools.critic is not None:
                    self.pools.critic.save_checkpoint(str(tmp / "critic"))
                if self.cfg.checkpoint.save_hf:
                    self.pools.learner.save_hf(str(tmp / "hf"))
                write_trainer_state(tmp, state)

            self.last_saved = self.checkpoints.save(self.state.totals.steps, write)
        finally:
            buffer.resume()
        return self.last_saved

    def attempt(self, action: Callable[[], object]) -> bool:
        """Run ``action`` (a call the learner ranks take part in: a save, an export); True
        once done. A worker process that dies in it (a learner rank's abort) is replaced and
        the run goes back to the latest complete checkpoint (``recover``): False then, and
        the steps after that checkpoint are trained again."""
        try:
            action()
        except Exception as exc:
            if not self.recover(exc):
                raise
            return False
        return True

    def checkpoint_or_recover(self) -> bool:
        """``save_checkpoint`` as an ``attempt``."""
        return self.attempt(self.save_checkpoint)

    def finish(self, at_exit: bool, final: Path | None) -> bool:
        """The saves after the run's last step: its checkpoint (``at_exit``, unless it has one
        already) and the policy exported to ``final`` as a Hugging Face directory (None: no
        export). True once both are written; False when a rank died in one and the run went
        back to the latest checkpoint: train the steps after it again, then call again."""
        self.state.buffer.pause()
        due = at_exit and self.checkpoints is not None and not self.saved_latest_step()
        if due and not self.checkpoint_or_recover():
            return False
        return final is None or self.attempt(lambda: self.pools.learner.save_hf(str(final)))

    def saved_latest_step(self) -> bool:
        """Whether the latest step has a checkpoint already."""
        return self.last_saved is not None and step_of(self.last_saved) == self.state.totals.steps

    def restore(self, path: Path) -> None:
        """Load the checkpoint at ``path`` into the learners and the run state, and put its
        weights in the engines (before the run starts, or after a recovery stopped the
        pipeline)."""
        saved = read_run_state(path, self.cfg.trainer.total_steps)  # checked before any use
        self.load_learners(path)
        self.load_state_dict(saved)
        self.pools.sync_weights(self.state.version)
        self.tracker.rewind(self.state.totals.steps)
        log.info(
            "resumed from %s: step %d, policy version %d", path, step_of(path), self.state.version
        )

    def load_learners(self, path: Path) -> None:
        """Load the policy (and critic) of the checkpoint at ``path`` into the learner groups,
        resharded to their world sizes (FSDP2)."""
        self.pools.learner.load_checkpoint(str(path / "policy"))
        if self.pools.critic is not None:
            self.pools.critic.load_checkpoint(str(path / "critic"))

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

    # ---- failures --------------------------------------------------------------------------

    def replace_rollout_worker(self, worker: int, exc: BaseException) -> bool:
        """A rollout loop's generation call failed: if its worker process died, start a new
        one with the current weights (the loop then retries its request); False otherwise, or
        when the run is stopping (a recovery on the learner thread replaces it then). Runs on
        the rollout loop's thread."""
        if not is_actor_failure(exc):
            return False
        state = self.state
        with state.weights_lock:  # the learner is not mid-update: its weights are version
            gate = state.pipeline.gate
            if gate.stopped:
                return False
            self.restarts.count("rollout", self.cfg.fault.max_rollout_restarts, exc)
            log.warning("rollout worker %d died (%s): restarting it", worker, exc)
            with gate.shut():
                self.pools.replace_rollout_worker(worker)
                self.pools.sync_weights(state.version)
        return True

    def recover(self, exc: Exception) -> bool:
        """A step failed in a worker process: replace the dead ones, go back to the latest
        checkpoint (or the start of the run) and go on. False for an error raised in this
        process (a bug or bad input: it stands). A failure no rollout worker explains (a dead
        reference rank included) counts as a learner restart, so a fault that repeats ends
        the run once ``fault.max_learner_restarts`` are used."""
        if not is_actor_failure(exc):
            return False
        self.state.pipeline.stop()
        self.scaler.drop_retired()
        dead = dead_actors(self.pools)
        latest = self.checkpoints.latest() if self.checkpoints is not None else None
        log.warning(
            "step %d failed (%s); %s; restoring %s",
            self.state.totals.steps + 1,
            exc,
            dead,
            latest or "the start of the run",
        )
        fault = self.cfg.fault
        for worker in dead.rollout:
            self.restarts.count("rollout", fault.max_rollout_restarts, exc)
            self.pools.rollout.replace(worker)
        if dead.learners or dead.reference or not dead.rollout:
            self.restarts.count("learner", fault.max_learner_restarts, exc)
        if dead.reference:  # frozen: a fresh group is the same reference
            self.pools.replace_reference()
        if dead.learners or latest is None:  # fresh learners: dead ones, or weights to rewind
            self.pools.replace_learners()
            self._new_learners()
        else:
            self.pools.connect_weight_sync()  # re-form the sync group the failure broke
        if latest is not None:
            self.restore(latest)
        else:
            self.load_state_dict(self._initial)
            self.pools.sync_weights(self.state.version)
            self.tracker.rewind(0)
        self.state.pipeline.start()
        return True
