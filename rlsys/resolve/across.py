"""Checks across sections of a run's config (``rlsys.resolve.resolve`` runs them, after each
section's own values and names are checked): each raises ``ConfigError`` naming the keys at
fault and the fix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlsys.algorithms.estimators import advantage_settings
from rlsys.algorithms.traits import (
    compares_group,
    has_ratio,
    uses_critic,
    uses_pass_k,
    uses_tree,
    uses_turns,
)
from rlsys.backends import BACKENDS
from rlsys.config.elastic import group_sizes
from rlsys.config.env import AGENT_ENV
from rlsys.config.errors import ConfigError
from rlsys.engines import ENGINES
from rlsys.weight_sync import TRANSPORTS

if TYPE_CHECKING:
    from rlsys.config.schema import TrainConfig


def check_train_config(cfg: TrainConfig, program: str = "train") -> None:
    """Every cross-section check of ``cfg`` for ``program`` (the CLI command that runs it)."""
    _check_eval_sizes(cfg, program)
    _check_algorithm_fit(cfg)
    _check_devices(cfg)
    _check_gpu_counts(cfg)
    _check_gpu_transport(cfg)
    _check_batch_feeds_groups(cfg)
    _check_replay(cfg)
    _check_tree_rollouts(cfg)
    _check_warm_start_demonstrations(cfg)
    _check_multi_turn_advantage(cfg)


def _check_eval_sizes(cfg: TrainConfig, program: str) -> None:
    """Evaluations draw from the task's held-out split: ``rlsys sft`` evaluates on
    ``sft.eval_prompts`` of them, every other program on ``eval.num_prompts`` (each is asked
    only for the key it uses)."""
    if program != "sft" and cfg.eval.num_prompts > cfg.task.eval_size:
        raise ConfigError(
            f"eval.num_prompts={cfg.eval.num_prompts} exceeds task.eval_size="
            f"{cfg.task.eval_size}; lower eval.num_prompts or raise task.eval_size"
        )
    if program == "sft" and cfg.sft.eval_prompts > cfg.task.eval_size:
        raise ConfigError(
            f"sft.eval_prompts={cfg.sft.eval_prompts} exceeds task.eval_size="
            f"{cfg.task.eval_size}; lower sft.eval_prompts"
        )


def _check_algorithm_fit(cfg: TrainConfig) -> None:
    """The algorithm against the group size, the staleness bound and the critic."""
    algo = cfg.algorithm
    if algo.filter_uniform_groups and cfg.rollout.n_samples < 2:
        raise ConfigError(
            f"rollout.n_samples={cfg.rollout.n_samples} with "
            "algorithm.filter_uniform_groups=true drops every group (one sample always "
            "ties with itself); set algorithm.filter_uniform_groups=false or "
            "rollout.n_samples=2 or more"
        )
    if not has_ratio(algo) and (cfg.learner.ppo_epochs > 1 or cfg.learner.num_mini_batches > 1):
        raise ConfigError(
            f"algorithm.policy_loss={algo.policy_loss} has no importance ratio, so only its "
            "first optimizer step per batch is on-policy; set learner.ppo_epochs=1 and "
            "learner.num_mini_batches=1, or use algorithm.policy_loss=ppo_clip"
        )
    if not has_ratio(algo) and cfg.buffer.max_staleness > 0:
        raise ConfigError(
            f"algorithm.policy_loss={algo.policy_loss} has no importance ratio, so it cannot "
            f"learn from buffer.max_staleness={cfg.buffer.max_staleness} versions old "
            "samples; set buffer.max_staleness=0 or algorithm.policy_loss=ppo_clip"
        )
    if cfg.critic.pretrain_steps and not uses_critic(algo):
        raise ConfigError(
            f"critic.pretrain_steps={cfg.critic.pretrain_steps} but "
            f"algorithm.advantage={algo.advantage} uses no critic; set "
            "critic.pretrain_steps=0 or algorithm.advantage=gae"
        )
    if uses_critic(algo) and cfg.critic.pretrain_steps >= cfg.trainer.total_steps:
        raise ConfigError(
            f"critic.pretrain_steps={cfg.critic.pretrain_steps} leaves no policy steps in "
            f"trainer.total_steps={cfg.trainer.total_steps}; lower critic.pretrain_steps"
        )
    if compares_group(algo) and cfg.rollout.n_samples < 2:
        raise ConfigError(
            f"rollout.n_samples={cfg.rollout.n_samples}: algorithm.advantage="
            f"{cfg.algorithm.advantage} compares the samples of a prompt and needs at "
            "least 2; set rollout.n_samples=2 or more"
        )
    k = advantage_settings(algo).k if uses_pass_k(algo) else 0
    if k >= cfg.rollout.n_samples:
        key = "algorithm.advantage_args.k" if "k" in algo.advantage_args else "algorithm.pass_k"
        raise ConfigError(
            f"{key}={k} with rollout.n_samples={cfg.rollout.n_samples}: pass@k needs k < "
            "n_samples (at k = n_samples every group's pass@k is certain and every advantage "
            f"0); lower {key} or raise rollout.n_samples"
        )


def _check_devices(cfg: TrainConfig) -> None:
    """Transports, engine sleep and dtypes against where the pools run."""
    transport = cfg.weight_sync.transport
    if TRANSPORTS.trait(transport, "colocated_gpus") and not (
        cfg.learner.num_gpus_per_rank > 0
        and cfg.rollout.num_gpus_per_worker > 0
        and cfg.placement.mode == "colocated"
    ):
        raise ConfigError(
            f"weight_sync.transport={transport} shares GPU memory, so it needs "
            "placement.mode=colocated with learner.num_gpus_per_rank > 0 and "
            "rollout.num_gpus_per_worker > 0; on CPU use weight_sync.transport=collective"
        )
    _check_engine_sleep(cfg)
    groups = [("learner", cfg.learner), ("critic", cfg.critic)]
    if cfg.reference_group:
        groups.append(("reference", cfg.reference.group(cfg.learner)))
    for key, group in groups:
        if cfg.model.dtype == "float16" and not BACKENDS.trait(group.backend, "float16"):
            raise ConfigError(
                f"{key}.backend={group.backend} with model.dtype=float16 is not supported "
                "(fp16 needs loss scaling); use model.dtype=bfloat16 or float32"
            )
        if group.mixed_precision is not None and cfg.model.dtype != "float32":
            raise ConfigError(
                f"{key}.mixed_precision={group.mixed_precision} needs fp32 master weights, "
                f"but model.dtype={cfg.model.dtype}; set model.dtype=float32 or "
                f"{key}.mixed_precision=null"
            )


def _check_gpu_counts(cfg: TrainConfig) -> None:
    """GPU actors hold whole GPUs (placement groups bind each to its own,
    rlsys.placement.gpu_slots): a rank of a learner-like group drives one, an engine one per
    tensor-parallel shard."""
    ranks = [
        ("learner.num_gpus_per_rank", cfg.learner.num_gpus_per_rank),
        ("critic.num_gpus_per_rank", cfg.critic.num_gpus_per_rank),
        ("reference.num_gpus", cfg.reference.num_gpus),
        ("reward.model.num_gpus", cfg.reward.model.num_gpus),
    ]
    for key, value in ranks:
        _whole_gpus(key, value)
        if value > 1:
            raise ConfigError(
                f"{key}={value:g}: a rank drives one GPU; set 1 and scale with the group's "
                "world_size"
            )
    rollout = cfg.rollout
    _whole_gpus("rollout.num_gpus_per_worker", rollout.num_gpus_per_worker)
    if rollout.num_gpus_per_worker > 1 and not ENGINES.trait(rollout.engine, "tensor_parallel"):
        raise ConfigError(
            f"rollout.num_gpus_per_worker={rollout.num_gpus_per_worker:g} with rollout.engine="
            f"{rollout.engine}: that engine runs on one GPU; set 1 and scale with "
            "rollout.num_workers, or use rollout.engine=vllm with "
            "rollout.vllm.tensor_parallel_size"
        )


def _whole_gpus(key: str, value: float) -> None:
    if value != int(value):
        raise ConfigError(
            f"{key}={value:g}: GPU actors hold whole GPUs (each is bound to its own); to share "
            "GPUs between the learner and the engines use placement.mode=colocated, and give "
            "whole numbers"
        )


def _check_gpu_transport(cfg: TrainConfig) -> None:
    """Weight transports against the GPU layout (rlsys.placement.gpu_slots): colocated learner
    rank 0 shares its GPU with engine 0, and the CUDA IPC sender reaches only engines on its
    GPU."""
    on_gpus = cfg.learner.num_gpus_per_rank > 0 and cfg.rollout.num_gpus_per_worker > 0
    if not on_gpus:
        return
    transport = cfg.weight_sync.transport
    colocated = cfg.placement.mode == "colocated"
    if colocated and transport == "collective":
        raise ConfigError(
            "weight_sync.transport=collective with placement.mode=colocated on GPUs: learner "
            "rank 0 and engine 0 share a GPU, and NCCL refuses two members of one group on one "
            "device; use weight_sync.transport=cuda_ipc (one engine on one GPU), "
            "weight_sync.transport=object_store, or placement.mode=disaggregated"
        )
    elastic = cfg.rollout.elastic
    workers = max(
        [cfg.rollout.num_workers, *elastic.schedule.values()]
        + ([elastic.autoscale.max_workers] if elastic.autoscale.enabled else [])
    )
    engine_gpus = workers * cfg.rollout.num_gpus_per_worker
    if TRANSPORTS.trait(transport, "colocated_gpus") and engine_gpus > 1:
        grown = "" if workers == cfg.rollout.num_workers else f" (the pool grows to {workers})"
        raise ConfigError(
            f"weight_sync.transport={transport} hands learner rank 0's buckets to engines on "
            f"its own GPU, but {workers} rollout worker(s){grown} x "
            f"rollout.num_gpus_per_worker={cfg.rollout.num_gpus_per_worker:g} engine GPUs reach "
            "past it; use one engine on one GPU, weight_sync.transport=object_store, or "
            "placement.mode=disaggregated with weight_sync.transport=collective"
        )


def _check_batch_feeds_groups(cfg: TrainConfig) -> None:
    """Every size a learner group takes in the run has a mini-batch shard per rank."""
    samples = cfg.data.batch_size * cfg.rollout.n_samples
    groups = [("learner", cfg.learner)]
    if uses_critic(cfg.algorithm):
        groups.append(("critic", cfg.critic))
    for key, group in groups:
        for size_key, size in group_sizes(cfg, key):
            needed = size * group.num_mini_batches
            if samples < needed:
                raise ConfigError(
                    f"data.batch_size * rollout.n_samples = {samples} samples cannot feed "
                    f"{size_key} = {size} ranks x {key}.num_mini_batches = "
                    f"{group.num_mini_batches}: {needed} mini-batch shards; raise "
                    f"data.batch_size, lower {key}.num_mini_batches or the ranks"
                )
    if cfg.critic.elastic.schedule and not uses_critic(cfg.algorithm):
        raise ConfigError(
            f"critic.elastic.schedule is set but algorithm.advantage={cfg.algorithm.advantage} "
            "runs no critic; remove critic.elastic.schedule"
        )


def _check_engine_sleep(cfg: TrainConfig) -> None:
    """Engines sleep only where they share devices with the learners and nothing
    generates while the learners train."""
    if not cfg.engines_sleep:
        return
    if cfg.placement.mode != "colocated":
        raise ConfigError(
            "placement.engine_sleep=true with placement.mode=disaggregated: the engines "
            "have devices of their own, so sleeping frees nothing for the learners; set "
            "placement.engine_sleep=false or placement.mode=colocated"
        )
    if cfg.buffer.max_staleness > 0:
        raise ConfigError(
            f"buffer.max_staleness={cfg.buffer.max_staleness} generates while the learners "
            "train, so colocated engines cannot sleep then (placement.engine_sleep is on: "
            "null turns it on where rollout workers have GPUs); set buffer.max_staleness=0, "
            "placement.mode=disaggregated, or placement.engine_sleep=false to share the "
            "GPUs statically (rollout.vllm.gpu_memory_utilization)"
        )


def _check_replay(cfg: TrainConfig) -> None:
    """Replayed samples come from older policies and take a group's place: they need the
    off-policy correction, and a group must keep generated samples."""
    replay = cfg.buffer.replay
    if not replay.enabled:
        return
    if cfg.algorithm.off_policy == "none":
        raise ConfigError(
            "buffer.replay.enabled=true trains on samples drawn by policies up to "
            f"buffer.replay.max_age={replay.max_age} versions old, but algorithm.off_policy="
            "none weighs them as on-policy; set algorithm.off_policy=tis (or decoupled)"
        )
    if replay.per_group >= cfg.rollout.n_samples:
        raise ConfigError(
            f"buffer.replay.per_group={replay.per_group} must be below rollout.n_samples="
            f"{cfg.rollout.n_samples} (a group keeps at least one sample of its own); lower "
            "buffer.replay.per_group"
        )
    if uses_tree(cfg.algorithm):
        raise ConfigError(
            f"buffer.replay.enabled=true with algorithm.advantage={cfg.algorithm.advantage}: "
            "a replayed sample belongs to an earlier group's tree, not this one's; set "
            "buffer.replay.enabled=false or another algorithm.advantage (e.g. grpo)"
        )


def _check_tree_rollouts(cfg: TrainConfig) -> None:
    """Tree rollouts branch single-turn replies; the tree advantage needs a tree."""
    tree = cfg.rollout.tree
    if tree.enabled and cfg.task.env.name is not None:
        raise ConfigError(
            f"rollout.tree.enabled=true with task.env.name={cfg.task.env.name}: tree rollouts "
            "branch single-turn replies, not multi-turn trajectories; set "
            "rollout.tree.enabled=false or task.env.name=null"
        )
    if tree.enabled and tree.mode == "iid" and cfg.rollout.stop:
        raise ConfigError(
            f"rollout.tree.mode=iid with rollout.stop={cfg.rollout.stop}: a reply that branches "
            "off onto a token of its own is continued from that token, and a stop string it "
            "completes would go unseen; give the stops as rollout.stop_token_ids, or set "
            "rollout.tree.mode=fixed"
        )
    if uses_tree(cfg.algorithm) and not tree.enabled:
        raise ConfigError(
            f"algorithm.advantage={cfg.algorithm.advantage} reads the tree of tree rollouts, "
            "but rollout.tree.enabled=false; set rollout.tree.enabled=true or "
            "another algorithm.advantage (e.g. grpo)"
        )


def _check_warm_start_demonstrations(cfg: TrainConfig) -> None:
    """A user's agent has no demonstrations (environments demonstrate theirs, in any tool
    format: ``Turns.demonstration`` writes them in the run's)."""
    if cfg.warm_start.enabled and cfg.task.env.name == AGENT_ENV:
        raise ConfigError(
            "warm_start.enabled=true with task.env.name=openai_agent: a user agent has no "
            "demonstrations to warm-start from; set warm_start.enabled=false"
        )


def _check_multi_turn_advantage(cfg: TrainConfig) -> None:
    """Step-level advantages compare the turns of multi-turn trajectories."""
    if uses_turns(cfg.algorithm) and cfg.task.env.name is None:
        raise ConfigError(
            f"algorithm.advantage={cfg.algorithm.advantage} groups the model turns of "
            "multi-turn trajectories by the state they acted on, but task.env.name=null "
            "(single-turn replies have one step); set task.env.name (e.g. task=calculator_tool "
            "or task=guess_number) or another algorithm.advantage (e.g. grpo)"
        )
