"""Typed configuration: the root ``TrainConfig`` and the configs of every component.

Every default lives in a dataclass of ``rlsys/config/`` (one module per section: this one
holds the root and the small sections); import them all from here. Each dataclass is one component's config; a
component receives only its own. The config is plain data: it imports no implementation.
Checks of one component's values live in its ``__post_init__``; the names a key gives (an
engine, a loss, a task) and the checks across components are ``rlsys.resolve``'s, where the
registries are. Every error names the key at fault and the fix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rlsys.config.algorithm import AlgorithmConfig
from rlsys.config.buffer import BufferConfig
from rlsys.config.checks import non_negative, one_of, positive
from rlsys.config.data import DataConfig
from rlsys.config.elastic import ElasticConfig, GroupElasticConfig
from rlsys.config.env import AGENT_ENV, EnvConfig
from rlsys.config.errors import ConfigError
from rlsys.config.launch import LauncherConfig
from rlsys.config.learner import CriticConfig, LearnerConfig
from rlsys.config.model import LoraConfig, ModelConfig
from rlsys.config.preference import DPOConfig, PreferenceDataConfig, RMConfig
from rlsys.config.recovery import CheckpointConfig, FaultConfig, check_resume
from rlsys.config.reward import RewardConfig
from rlsys.config.rollout import RolloutConfig, VLLMConfig
from rlsys.config.shapes import ShapesConfig
from rlsys.config.task import TaskConfig
from rlsys.config.tree import TreeConfig

__all__ = [  # every config class, importable from here
    "AGENT_ENV",
    "AlgorithmConfig",
    "BufferConfig",
    "CheckpointConfig",
    "ClusterConfig",
    "CriticConfig",
    "DPOConfig",
    "DataConfig",
    "ElasticConfig",
    "EnvConfig",
    "EvalConfig",
    "FaultConfig",
    "GroupElasticConfig",
    "LauncherConfig",
    "LearnerConfig",
    "LoraConfig",
    "ModelConfig",
    "PlacementConfig",
    "PreferenceDataConfig",
    "RMConfig",
    "ReferenceConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "ShapesConfig",
    "TaskConfig",
    "TrackingConfig",
    "TrainConfig",
    "TrainerConfig",
    "TreeConfig",
    "VLLMConfig",
    "WarmStartConfig",
    "WeightSyncConfig",
]


@dataclass
class RunConfig:
    """Where a run writes and how it is seeded."""

    name: str | None = None  # run directory name; default: a timestamp
    output_dir: str = "outputs"  # parent of run directories
    seed: int = 0  # seeds data order, sampling and model init


@dataclass
class ClusterConfig:
    """Which Ray cluster to use."""

    address: str | None = None  # null: start a local Ray; "auto" or "ray://host:10001": join one
    num_cpus: int | None = None  # local Ray only: CPUs to give it (null: all cores)
    num_gpus: int | None = None  # local Ray only: GPUs to give it (null: all visible)

    def __post_init__(self) -> None:
        if self.num_cpus is not None:
            positive("cluster.num_cpus", self.num_cpus)
        if self.num_gpus is not None:
            non_negative("cluster.num_gpus", self.num_gpus)


@dataclass
class ReferenceConfig:
    """The frozen reference policy (started only when algorithm.kl_coef > 0): an inference-only
    learner group, its model sharded over its ranks like the learner's, with no optimizer."""

    # reference ranks; > 1 shards the model over them (a policy too large for one device)
    world_size: int = 1
    # fsdp2 or deepspeed (always ZeRO-3 here: the stage that shards parameters); null: the
    # learner's backend
    backend: str | None = None
    num_cpus: float = 1.0  # CPUs per rank; also its torch thread count
    num_gpus: float = 0.0  # GPUs per rank (0: CPU)
    # with model.lora.rank > 0: the reference log-probs come from the learner's own base model
    # (adapters off) and no reference group starts; false: a separate reference group
    from_lora_base: bool = True

    def __post_init__(self) -> None:
        positive("reference.world_size", self.world_size)
        positive("reference.num_cpus", self.num_cpus)
        non_negative("reference.num_gpus", self.num_gpus)

    def group(self, learner: LearnerConfig) -> LearnerConfig:
        """The learner-group config the reference ranks are built from: the learner's micro
        batch (rows, token budget) and logit slices, with this world size and backend, the
        model's dtype throughout (no mixed precision, no compiled layers, no offload) and
        ZeRO-3 for DeepSpeed."""
        return dataclasses.replace(
            learner,
            backend=self.backend or learner.backend,
            world_size=self.world_size,
            num_cpus_per_rank=self.num_cpus,
            num_gpus_per_rank=self.num_gpus,
            mixed_precision=None,
            reduce_dtype="float32",
            compile=False,
            activation_checkpointing=False,
            offload=False,
            deepspeed=dataclasses.replace(learner.deepspeed, zero_stage=3),
            elastic=GroupElasticConfig(),  # the reference keeps its size
        )


@dataclass
class WeightSyncConfig:
    """How new weights travel from the learner to the rollout engines."""

    # object_store: numpy buckets through Ray's object store (any placement);
    # collective: a process group from learner rank 0 to every engine (gloo on CPU, NCCL on
    # GPU), bucketed and pipelined; cuda_ipc: engines on the learner's GPU map its buckets.
    transport: str = "object_store"
    bucket_mb: float = 64.0  # a bucket holds at most this many MiB of tensors
    # collective on CPU: "shm" moves bucket bytes through shared memory when every engine is on
    # the learner's node (gloo only signals), "gloo" sends them over gloo, "auto" picks shm
    # when it can.
    cpu_data_plane: str = "auto"
    # The shm plane with HF engines on CPU (all of one dtype, no LoRA merge): the engines keep
    # their weights as views of the plane's files instead of copying them in. Two versions of
    # the model (in the engines' dtype) stay in /dev/shm, shared by the node's engines; a load
    # is the learner's one packing copy (docs/weight-sync.md has the figures). false: copy.
    zero_copy: bool = True
    timeout_s: float = 600.0  # a sync group member waiting longer than this fails the run

    def __post_init__(self) -> None:
        positive("weight_sync.bucket_mb", self.bucket_mb)
        one_of("weight_sync.cpu_data_plane", self.cpu_data_plane, ("auto", "shm", "gloo"))
        positive("weight_sync.timeout_s", self.timeout_s)


@dataclass
class PlacementConfig:
    """Whether rollout and learner pools share devices or have their own."""

    mode: str = "colocated"  # colocated: pools time-share the same CPUs/GPUs
    # Custom Ray resources each actor of a pool asks for, to pin the pool to the nodes that
    # advertise them (`ray start --resources='{"rollout_nodes": 4}'`, a KubeRay worker group,
    # a Slurm node group): e.g. placement.rollout_resources={rollout_nodes:1}. Empty: any node.
    rollout_resources: dict[str, float] = field(default_factory=dict)  # each rollout worker
    learner_resources: dict[str, float] = field(default_factory=dict)  # learner, critic, reference
    # Colocated, synchronous runs: the rollout engines sleep while the learners train (their
    # weights and KV cache leave the device: to host memory on a GPU, to a file on a CPU) and
    # wake before the weight sync. null: on where rollout workers have GPUs, off on CPU (there
    # a sleeping engine writes its weights to disk and reads them back every step, which pays
    # only when RAM is short).
    engine_sleep: bool | None = None

    def __post_init__(self) -> None:
        one_of("placement.mode", self.mode, ("colocated", "disaggregated"))
        for key in ("rollout_resources", "learner_resources"):
            for name, amount in getattr(self, key).items():
                if name in ("CPU", "GPU", "memory"):
                    raise ConfigError(
                        f"placement.{key} names {name!r}, which the pool sizes already set; "
                        "use rollout.num_cpus_per_worker / learner.num_gpus_per_rank etc. and "
                        "keep custom resources for node groups"
                    )
                positive(f"placement.{key}.{name}", amount)


@dataclass
class TrainerConfig:
    """Length of the run and how often it evaluates."""

    total_steps: int = 400  # RL steps (one batch each)
    eval_every: int = 25  # greedy held-out eval every K steps (0: only before and after)
    max_wall_s: float | None = None  # stop early (with a final eval) after this many seconds
    # Stop early (with a final eval) once this many replies were generated: compares
    # algorithms at one sample budget (DAPO's dynamic sampling draws extra groups, and ReMax's
    # greedy baseline reply per prompt counts too).
    max_samples: int | None = None

    def __post_init__(self) -> None:
        positive("trainer.total_steps", self.total_steps)
        non_negative("trainer.eval_every", self.eval_every)
        if self.max_wall_s is not None:
            positive("trainer.max_wall_s", self.max_wall_s)
        if self.max_samples is not None:
            positive("trainer.max_samples", self.max_samples)


@dataclass
class EvalConfig:
    """Held-out evaluation."""

    num_prompts: int = 500  # taken from the start of the task's eval split
    max_new_tokens: int | None = None  # null: as in training
    # A prompt metadata key (e.g. "level" of the arithmetic task): each evaluation also logs
    # eval/accuracy_<value> over the held-out prompts of each value. null: overall only.
    group_by: str | None = None
    # Held-out prompts after the first num_prompts, scored at every evaluation of
    # `rlsys train`; the policy with the best accuracy on them is exported to
    # checkpoints/best (docs/usage.md, "Keeping the best policy"). 0: off.
    validation_prompts: int = 0

    def __post_init__(self) -> None:
        positive("eval.num_prompts", self.num_prompts)
        non_negative("eval.validation_prompts", self.validation_prompts)
        if self.max_new_tokens is not None:
            positive("eval.max_new_tokens", self.max_new_tokens)


@dataclass
class SFTConfig:
    """Supervised fine-tuning (``rlsys sft`` and the warm start of ``rlsys train``)."""

    max_steps: int = 1500  # upper bound on SFT steps
    batch_size: int = 64  # (prompt, answer) pairs per step
    lr: float = 1e-3  # peak AdamW rate of SFT
    eval_every: int = 10  # greedy eval every K steps (checks target_accuracy)
    eval_prompts: int = 200  # held-out prompts per SFT eval
    # Stop at the first eval at or above this (null: never). The default warm start stops
    # part-way, so RL has room to show what it adds.
    target_accuracy: float | None = 0.45

    def __post_init__(self) -> None:
        positive("sft.max_steps", self.max_steps)
        positive("sft.batch_size", self.batch_size)
        positive("sft.lr", self.lr)
        positive("sft.eval_every", self.eval_every)
        positive("sft.eval_prompts", self.eval_prompts)
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ConfigError(f"sft.target_accuracy={self.target_accuracy} must be in (0, 1]")


@dataclass
class WarmStartConfig:
    """Brief SFT before RL, cached so later runs skip it."""

    enabled: bool = True  # run SFT before RL
    cache: bool = True  # reuse a cached warm-started model with the same inputs


@dataclass
class TrackingConfig:
    """Where metrics go besides metrics.jsonl."""

    console: bool = True  # one line per step on stderr
    wandb: bool = False  # log to Weights & Biases
    wandb_project: str = "rlsys"  # wandb project name
    wandb_mode: str = "offline"  # offline | online
    tensorboard: bool = False  # write <run_dir>/tensorboard event files
    mlflow: bool = False  # log params (the flattened config), metrics and sample tables to MLflow
    # MLflow tracking URI (a server, or a database such as sqlite:///path/mlflow.db); null: an
    # offline store in <run_dir>/mlflow.db with artifacts in <run_dir>/mlartifacts
    mlflow_tracking_uri: str | None = None
    mlflow_experiment: str = "rlsys"  # MLflow experiment name (created when missing)
    # Every K steps a table of the step's training samples (prompt, answer, response, reward,
    # correct) goes to <run_dir>/samples.jsonl and each enabled tracker (0: never)
    sample_table_every: int = 25
    sample_table_rows: int = 8  # samples per table, one per prompt in batch order
    # Log the step's rooflines (perf/learner_tflops, perf/mfu, perf/decode_bw_frac,
    # perf/floor_s: docs/roofline.md); the learner ranks measure their matmul peak and copy
    # bandwidth once at start (about 0.3 s on a CPU, under a second on a GPU)
    roofline: bool = True

    def __post_init__(self) -> None:
        one_of("tracking.wandb_mode", self.wandb_mode, ("offline", "online"))
        non_negative("tracking.sample_table_every", self.sample_table_every)
        positive("tracking.sample_table_rows", self.sample_table_rows)
        if not self.mlflow_experiment:
            raise ConfigError(
                "tracking.mlflow_experiment is empty; set it to an experiment name, e.g. rlsys"
            )


@dataclass
class TrainConfig:
    """Root config of ``rlsys train`` / ``sft`` / ``rm`` / ``dpo`` / ``eval``."""

    run: RunConfig = field(default_factory=RunConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    preference: PreferenceDataConfig = field(default_factory=PreferenceDataConfig)  # rm / dpo
    rm: RMConfig = field(default_factory=RMConfig)  # `rlsys rm` only
    dpo: DPOConfig = field(default_factory=DPOConfig)  # `rlsys dpo` only
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)  # `rlsys submit` only
    # Continue a run from its latest complete checkpoint: "auto" (run.name's directory, else
    # the newest run in run.output_dir that has one), a run directory, or a checkpoint.
    resume: str | None = None
    # Python files (or module names) every process of the run imports before the config is
    # resolved: implementations that register themselves (a loss, an estimator, a reward, a
    # task) from outside rlsys, named then like built-in ones (docs/extending.md). A saved
    # run config never imports them by itself.
    plugins: list[str] = field(default_factory=list)

    @property
    def reference_from_learner(self) -> bool:
        """Whether a KL term's reference log-probs come from the learner's base model with
        its LoRA adapters off (no reference group)."""
        return (
            self.algorithm.uses_reference
            and self.model.lora.enabled
            and self.reference.from_lora_base
        )

    @property
    def engines_sleep(self) -> bool:
        """Whether the controller puts the engines to sleep while the learners train
        (``placement.engine_sleep``, its null resolved)."""
        if self.placement.engine_sleep is not None:
            return self.placement.engine_sleep
        return self.placement.mode == "colocated" and self.rollout.num_gpus_per_worker > 0

    @property
    def reference_group(self) -> bool:
        """Whether the run starts a reference group (a KL term, and not from the learner)."""
        return self.algorithm.uses_reference and not self.reference_from_learner

    def __post_init__(self) -> None:
        check_resume(self.resume)
