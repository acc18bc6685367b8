"""Build every worker pool of a run from its config, and move weights between them."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import ray

from rlsys.config.schema import TrainConfig
from rlsys.placement.resources import Placement, Roles, plan_placement
from rlsys.rewards.service import RewardService
from rlsys.types import Completion, SamplingParams
from rlsys.weight_sync import TRANSPORTS
from rlsys.weight_sync.base import SendResult, WeightTransport, WeightUpdate
from rlsys.workers.calls import get_all
from rlsys.workers.learner import LearnerGroup
from rlsys.workers.rollout import RolloutPool


@dataclass
class Pools:
    """The actors of one run."""

    learner: LearnerGroup
    rollout: RolloutPool
    reference: LearnerGroup | None  # inference-only: the frozen reference policy
    transport: WeightTransport
    bucket_bytes: int
    critic: LearnerGroup | None = None
    # Start a fresh policy / critic group of N ranks (recovery after a rank died, a resize),
    # or reference group.
    respawn_learner: Callable[[int], LearnerGroup] | None = None
    respawn_critic: Callable[[int], LearnerGroup] | None = None
    respawn_reference: Callable[[], LearnerGroup] | None = None
    scorer: RewardService | None = None  # None: the collector scores in this process
    placement: Placement | None = None  # its GPU placement groups go when the pools stop

    def sync_weights(self, version: int) -> SendResult:
        """Send the learner's weights as ``version`` and load them into every engine.

        Sender and receivers run at once: streaming transports hand buckets over as they are
        gathered; the object store's receivers wait for the sender's published refs."""
        sends = self.learner.publish_weights(version, self.bucket_bytes)
        loads = self.rollout.update_weights(WeightUpdate(version, published=sends[0]))
        return get_all(sends + loads)[0]

    def connect_weight_sync(self) -> None:
        """Form the sync group: learner rank 0 as sender, every rollout worker a receiver."""
        world_size = 1 + len(self.rollout.workers)
        rank0 = self.learner.workers[0]
        address = ray.get(rank0.sync_address.remote())
        if set(self.rollout.node_ids()) <= {ray.get(rank0.node_id.remote())}:
            # every member on rank 0's node: its store listens on loopback only
            address = dataclasses.replace(address, host="127.0.0.1")
        get_all(
            [
                rank0.connect_weight_sync.remote(self.transport, world_size, address),
                *self.rollout.connect_weight_sync(self.transport, world_size, address),
            ]
        )

    def replace_rollout_worker(self, worker: int) -> None:
        """A fresh engine for rollout worker ``worker``, in the sync group (then send it the
        current weights: ``sync_weights``). Call with the rollout loops held and the learner
        idle: the whole sync group is re-formed."""
        self.rollout.replace(worker)
        self.connect_weight_sync()

    def replace_learners(self, sizes: dict[str, int] | None = None, connect: bool = True) -> None:
        """Kill the learner (and critic) groups and start fresh ones on their starting
        weights (load a checkpoint next), each with as many ranks as before or as ``sizes``
        asks (``{"learner": 2, "critic": 1}``); then re-form the sync group (``connect``)."""
        sizes = sizes or {}
        ranks = sizes.get("learner", len(self.learner.workers))
        self.learner.shutdown(timeout_s=5.0)
        self.learner = self.respawn_learner(ranks)
        if self.critic is not None:
            ranks = sizes.get("critic", len(self.critic.workers))
            self.critic.shutdown(timeout_s=5.0)
            self.critic = self.respawn_critic(ranks)
        if connect:
            self.connect_weight_sync()

    def replace_reference(self) -> None:
        """Kill the reference group and start a fresh one (it never changes: nothing to load)."""
        self.reference.shutdown(timeout_s=5.0)
        self.reference = self.respawn_reference()

    def release_memory(self) -> dict[str, float]:
        """Learner, critic and reference ranks hand back memory they hold but do not use
        (before colocated engines wake); ``memory/<group>_<figure>`` metrics."""
        groups = {"learner": self.learner, "critic": self.critic, "reference": self.reference}
        return {
            f"memory/{name}_{key.removesuffix('_bytes')}_bytes": value
            for name, group in groups.items()
            if group is not None
            for key, value in group.release_memory().items()
        }

    def node_ids(self) -> dict[str, list[str]]:
        """The Ray node each actor runs on, per pool (summary.json's ``nodes``)."""
        nodes = {"rollout": self.rollout.node_ids(), "learner": self.learner.node_ids()}
        if self.critic is not None:
            nodes["critic"] = self.critic.node_ids()
        if self.reference is not None:
            nodes["reference"] = self.reference.node_ids()
        return nodes

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        seed: int | None = None,
        budgets: list[int] | None = None,
        images: list | None = None,
    ) -> list[list[Completion]]:
        return self.rollout.generate(prompts, sampling, seed, budgets, images)

    def shutdown(self) -> None:
        """Stop every actor; a failure in one pool does not leave the others running."""
        stops = [self.rollout.shutdown, self.learner.shutdown]
        if self.scorer is not None:
            stops.append(self.scorer.shutdown)
        if self.critic is not None:
            stops.append(self.critic.shutdown)
        if self.reference is not None:
            stops.append(self.reference.shutdown)
        if self.placement is not None:
            stops.append(self.placement.release)  # after the actors in its slots
        errors = []
        for stop in stops:
            try:
                stop()
            except Exception as exc:  # noqa: BLE001 - stop the rest, then report
                errors.append(exc)
        if errors:
            raise errors[0]


def _start_at_once(
    starters: dict[str, Callable[[], Any]],
    stop: Callable[[Any], None],
    after: tuple[str, ...] = (),
):
    """Run every starter at once and return their results by name. Each starter creates its
    actors and waits until they are up, so the pools' processes start, import and load their
    models in parallel instead of one pool after another; the starters named in ``after``
    run once the others are up. If any starter fails, whatever did start is stopped
    (``stop(result)``) and the first failure is raised."""
    waves = [{n: f for n, f in starters.items() if n not in after}]
    waves.append({n: f for n, f in starters.items() if n in after})
    futures: dict[str, Any] = {}
    with ThreadPoolExecutor(max_workers=len(starters), thread_name_prefix="start") as pool:
        for wave in waves:
            futures.update({name: pool.submit(fn) for name, fn in wave.items()})
            wait(futures.values())
            if any(f.exception() is not None for f in futures.values()):
                break
    failures = [f.exception() for f in futures.values() if f.exception() is not None]
    if failures:
        for future in futures.values():
            if future.exception() is None:
                with contextlib.suppress(Exception):  # report the start failure, not this
                    stop(future.result())
        raise failures[0]
    return {name: future.result() for name, future in futures.items()}


def engines_start_last(cfg: TrainConfig) -> bool:
    """Whether engines start after the learner-side pools: on GPUs they share, so that an
    engine that sizes its KV cache from free memory (vLLM) sees what the learners hold."""
    return (
        cfg.placement.mode == "colocated"
        and cfg.rollout.num_gpus_per_worker > 0
        and cfg.learner.num_gpus_per_rank > 0
    )


def _stop_started(started: Any) -> None:
    if isinstance(started, ray.actor.ActorHandle):
        ray.kill(started)
    elif started is not None:
        started.shutdown()


def lora_scale(cfg: TrainConfig) -> float | None:
    """What rollout workers merge the policy's adapters with (None: no LoRA)."""
    return cfg.model.lora.scale if cfg.model.lora.enabled else None


def start_pools(
    cfg: TrainConfig, model_path: str, roles: Roles, temperature: float | None = None
) -> Pools:
    """Start rollout and learner actors on ``model_path``, and the reference and critic
    ``roles`` asks for (the critic on ``critic.model_path``, default ``model_path``). The
    pools start at the same time; a failed start stops the ones that came up.

    Learner and reference log-probabilities use ``temperature`` (default: the rollout's
    sampling temperature, so they score what the engines sampled; SFT passes 1.0).
    """
    placement = plan_placement(cfg, roles)
    if temperature is None:
        temperature = cfg.rollout.temperature

    def respawn_learner(world_size: int = cfg.learner.world_size) -> LearnerGroup:
        return LearnerGroup(
            dataclasses.replace(cfg.learner, world_size=world_size),
            placement.learner,
            model_path,
            cfg.model.dtype,
            temperature,
            lora=cfg.model.lora,
            freeze_vision=cfg.model.freeze_vision,
        )

    def respawn_critic(world_size: int = cfg.critic.world_size) -> LearnerGroup:
        return LearnerGroup(
            dataclasses.replace(cfg.critic, world_size=world_size),
            placement.critic,
            cfg.critic.model_path or model_path,
            cfg.model.dtype,
            temperature,
            role="value",
        )

    def respawn_reference() -> LearnerGroup:
        return LearnerGroup(
            cfg.reference.group(cfg.learner),
            placement.reference,
            model_path,
            cfg.model.dtype,
            temperature,
            trainable=False,
        )

    starters: dict[str, Callable[[], Any]] = {
        "rollout": lambda: RolloutPool(
            cfg.rollout, placement.rollout, model_path, cfg.model.dtype, lora_scale(cfg)
        ),
        "learner": respawn_learner,
    }
    if roles.critic:
        starters["critic"] = respawn_critic
    if roles.reference:
        starters["reference"] = respawn_reference
    if roles.rewards:
        starters["scorer"] = lambda: RewardService(
            cfg.task.reward,
            cfg.reward,
            placement.reward,
            cfg.task.chat_template,
            placement.reward_model,
            placement.judge,
        )
    try:
        up = _start_at_once(
            starters, _stop_started, ("rollout",) if engines_start_last(cfg) else ()
        )
    except BaseException:
        placement.release()
        raise
    pools = Pools(
        up["learner"],
        up["rollout"],
        up.get("reference"),
        TRANSPORTS.get(cfg.weight_sync.transport)(cfg.weight_sync),
        int(cfg.weight_sync.bucket_mb * (1 << 20)),
        up.get("critic"),
        respawn_learner,
        respawn_critic if roles.critic else None,
        respawn_reference if roles.reference else None,
        up.get("scorer"),
        placement,
    )
    try:
        pools.connect_weight_sync()
    except BaseException:
        with contextlib.suppress(Exception):  # report the connect failure, not a cleanup one
            pools.shutdown()
        raise
    return pools
