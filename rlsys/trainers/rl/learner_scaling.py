"""The RL run's elastic learner: the learner group (and the critic's) restarts at another number
of ranks between learner steps, asked for by ``learner.elastic.schedule`` /
``critic.elastic.schedule`` or ``rlsys scale RUN_DIR learner=N [critic=M]``.

With the learner idle after a step: the run checkpoints (its normal checkpoint, so the switch
is also a resume point; none is written twice for a step), the old ranks stop, N new ones
start and load that checkpoint resharded (FSDP2 DCP; DeepSpeed is refused at the request and
in the config), and, with the rollout loops held at the gate, the weight-sync group is
re-formed with the new rank 0. The run state (buffer, sampler, step, policy version) never
leaves memory, so nothing is lost, redone or counted twice. In async mode the rollout loops go
on generating on the current weights while the new ranks start and load; the engines keep
those weights (the loaded ones are the same), so nothing is sent until the next step.

A critic with no size of its own asked for at that step follows the learner's new size.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import ray

from rlsys.config.elastic import RESIZABLE_GROUPS
from rlsys.config.errors import ConfigError
from rlsys.config.schema import TrainConfig
from rlsys.placement.resources import Roles, check_fits, connected_node_gpus
from rlsys.resolve import resized
from rlsys.trainers.rl.recovery import Recovery
from rlsys.trainers.rl.state import RunState
from rlsys.workers.pools import Pools

log = logging.getLogger(__name__)


class LearnerScaler:
    """Resize the learner groups of the run ``state`` (see the module docstring).
    ``new_learners`` sets up groups started afresh (their learning rates)."""

    def __init__(
        self,
        cfg: TrainConfig,
        pools: Pools,
        state: RunState,
        recovery: Recovery,
        new_learners: Callable[[], None],
    ) -> None:
        self.cfg, self.pools, self.state, self.recovery = cfg, pools, state, recovery
        self._new_learners = new_learners
        self.roles = Roles.for_rl(cfg)
        for key in RESIZABLE_GROUPS:
            for step, size in getattr(cfg, key).elastic.schedule.items():
                self._check({key: size}, f"{key}.elastic.schedule at step {step}")

    def sizes(self) -> dict[str, int]:
        """The ranks each learner group has now."""
        sizes = {"learner": len(self.pools.learner.workers)}
        if self.pools.critic is not None:
            sizes["critic"] = len(self.pools.critic.workers)
        return sizes

    def after_step(self, step: int, wanted: dict[str, tuple[int, str]]) -> None:
        """After learner step ``step``: restart the groups ``wanted`` asks to resize (a request
        the run cannot take is refused with a warning, and the run goes on as it is)."""
        targets = self._targets(wanted)
        if not targets:
            return
        source = ", ".join(
            f"{key}={size} ({wanted[key][1] if key in wanted else 'follows the learner'})"
            for key, size in targets.items()
        )
        try:
            self._check(targets, source)
        except ConfigError as exc:
            log.warning("learner resize after step %d refused: %s", step, exc)
            return
        log.info("learner resize after step %d: %s", step, source)
        self._switch(step, targets)

    def _targets(self, wanted: dict[str, tuple[int, str]]) -> dict[str, int]:
        """The groups to resize and their new sizes: the critic follows a resized learner
        unless its own size is asked for too; sizes the groups have already are dropped."""
        current = self.sizes()
        targets = {key: wanted[key][0] for key in RESIZABLE_GROUPS if key in wanted}
        follows = "critic" in current and "critic" not in targets
        if follows and targets.get("learner", current["learner"]) != current["learner"]:
            targets["critic"] = targets["learner"]
        return {key: size for key, size in targets.items() if current.get(key) != size}

    def _check(self, sizes: dict[str, int], source: str) -> None:
        """Raise ConfigError unless the run can take ``sizes``: a config that validates with
        them (backend, batch), checkpoints to reshard through, and room in the cluster."""
        if self.recovery.checkpoints is None:
            raise ConfigError(
                f"{source}: resizing a learner group goes through a checkpoint, and this run "
                "keeps none (run it with `rlsys train`, which keeps RUN_DIR/checkpoints)"
            )
        cfg = resized(self.cfg, sizes)
        # the cluster holds the rollout pool as it is now, not as it started
        rollout = dataclasses.replace(cfg.rollout, num_workers=len(self.pools.rollout.workers))
        cfg = dataclasses.replace(cfg, rollout=rollout)
        if not ray.is_initialized():
            return
        total = ray.cluster_resources()
        try:
            check_fits(
                cfg,
                total.get("CPU", 0),
                total.get("GPU", 0),
                self.roles,
                total,
                connected_node_gpus(),
            )
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from exc

    def _switch(self, step: int, sizes: dict[str, int]) -> None:
        """Checkpoint, restart the groups at ``sizes``, load the checkpoint, re-form the sync
        group (see the module docstring)."""
        before = self.sizes()
        path = self._checkpoint()
        state = self.state
        with state.weights_lock:  # no rollout worker is replaced (and sent weights) meanwhile
            with self._scoring_held():
                self.pools.replace_learners(sizes, connect=False)
                self._new_learners()
                self.recovery.load_learners(path)
            with state.pipeline.gate.shut():
                self.pools.connect_weight_sync()
        for key, size in sizes.items():
            log.info("%s group: %d -> %d ranks after step %d", key, before[key], size, step)
            event = {"step": step, "pool": key, "from": before[key], "to": size}
            state.totals.scale_events.append(event)

    def _checkpoint(self) -> Path:
        """The checkpoint of the latest step, written now unless it was already."""
        if not self.recovery.saved_latest_step():
            self.state.buffer.pause()  # save_checkpoint drains in-flight groups, then resumes
            self.recovery.save_checkpoint()
        return self.recovery.last_saved

    @contextmanager
    def _scoring_held(self) -> Iterator[None]:
        """A LoRA run's reference log-probs come from the learner (``reference_from_learner``),
        so scoring must not call it while it restarts: no new prompts, none in flight."""
        if not self.cfg.reference_from_learner:
            yield
            return
        buffer = self.state.buffer
        buffer.pause()
        try:
            buffer.wait_drained()
            yield
        finally:
            buffer.resume()
