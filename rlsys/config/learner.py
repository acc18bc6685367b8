"""Configs of a learner group: its optimizer, the policy learner and the critic."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlsys.config.checks import non_negative, one_of, positive
from rlsys.config.elastic import GroupElasticConfig
from rlsys.config.errors import ConfigError


@dataclass
class OptimConfig:
    """AdamW settings of a learner."""

    lr: float = 3e-4  # Adam moves every weight by ~lr on its first steps: keep RL rates small
    warmup_steps: int = 10  # optimizer steps of linear learning-rate warm-up
    schedule: str = "cosine"  # after warm-up: "cosine" decay over the run, or "constant"
    min_lr_ratio: float = 0.1  # cosine floor, as a fraction of lr
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    # AdamW (beta1, beta2), each in [0, 1)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping

    def check(self, prefix: str) -> None:
        """Validate, naming keys under ``prefix`` (the config that owns this optimizer)."""
        positive(f"{prefix}.lr", self.lr)
        non_negative(f"{prefix}.warmup_steps", self.warmup_steps)
        one_of(f"{prefix}.schedule", self.schedule, ("cosine", "constant"))
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"{prefix}.min_lr_ratio={self.min_lr_ratio} must be in [0, 1]")
        non_negative(f"{prefix}.weight_decay", self.weight_decay)
        non_negative(f"{prefix}.grad_clip", self.grad_clip)
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(
                f"{prefix}.betas={list(self.betas)} must be two numbers in [0, 1), e.g. [0.9, 0.99]"
            )


MIXED_PRECISION = (
    "bfloat16",
    "auto",
)  # float16 would need loss scaling; auto: rlsys.resolve.precision
REDUCE_DTYPES = ("float32", "bfloat16")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")  # learner.compile_backend
ZERO_STAGES = (2, 3)


@dataclass
class DeepSpeedConfig:
    """DeepSpeed ZeRO settings, used when the learner's ``backend`` is ``deepspeed``."""

    # 2: gradients and optimizer state sharded over ranks, parameters whole on each rank;
    # 3: parameters sharded too (gathered layer by layer in forward/backward)
    zero_stage: int = 2
    # ZeRO-3: parameters with fewer elements stay whole on every rank (no gather); 0 shards all
    param_persistence_threshold: int = 100_000

    def check(self, prefix: str) -> None:
        """Validate, naming keys under ``prefix`` (e.g. learner.deepspeed)."""
        if self.zero_stage not in ZERO_STAGES:
            raise ConfigError(
                f"{prefix}.zero_stage={self.zero_stage} is not one of {list(ZERO_STAGES)}; "
                "use 2 (shard gradients + optimizer state) or 3 (also parameters)"
            )
        non_negative(f"{prefix}.param_persistence_threshold", self.param_persistence_threshold)


@dataclass
class LearnerConfig:
    """The learner group: `world_size` Ray actors running one training backend."""

    backend: str = "fsdp2"  # training backend: fsdp2 or deepspeed (settings under deepspeed)
    world_size: int = 2  # learner ranks (data parallel, sharded)
    num_cpus_per_rank: float = 1.0  # also the torch thread count of each rank
    num_gpus_per_rank: float = 0.0  # GPUs per learner rank (0: CPU, gloo)
    num_mini_batches: int = 1  # optimizer steps per pass over the batch (PPO mini-batches)
    ppo_epochs: int = 2  # passes over the batch
    micro_batch_size: int = 128  # sequences per forward/backward on one rank, at most
    # Tokens per forward/backward on one rank, at most: a micro-batch holds as many rows as
    # fit (rows x the batch's padded length; at least one row, at most micro_batch_size), in
    # every pass (train step, log-probabilities, values, scores), so activation memory stays
    # bounded as responses grow. 16384 leaves micro-batches of 128 rows up to 128 tokens long
    # as they were (the built-in CPU job's sequences are ~10 tokens: its figures hold) and cuts
    # 1k-token responses into ~14 rows (verl's token budget per GPU defaults to 16384 too).
    # Loss and gradients do not depend on the cut. null: micro_batch_size rows, any length.
    max_tokens_per_micro_batch: int | None = 16384
    # The LM head runs on slices of this many positions (rlsys/models/lm_head.py): each
    # slice's logits are reduced to log-probabilities (and entropies) and dropped, and
    # recomputed in backward, so memory holds one slice's logits, not a micro-batch's
    # (B, T, V). 1024 positions x Qwen2.5's 152k vocabulary are 0.6 GB of fp32 logits; the
    # cost is one more head matmul per slice in backward. null: a micro-batch at once.
    logits_chunk_tokens: int | None = 1024
    # Pack sequences (rlsys/models/packing.py): a micro-batch's rows are its sequences'
    # real tokens concatenated, position ids restarting per sequence, attention kept within
    # each (a block-diagonal causal mask; SDPA or eager attention, not flash-attention), up
    # to the batch's padded length a packed row and as many packed rows a micro-batch as
    # there would be padded rows (micro_batch_size, max_tokens_per_micro_batch). The policy's
    # train and log-probability passes (the reference's too) and the critic's; not a reward
    # model's, nor a vision-language model's (an error). Same log-probabilities, values, loss
    # and gradients as unpacked up to float rounding; only speed and padding change
    # (docs/learners.md has the figures).
    packing: bool = False
    # With packing, a prompt is held once for the samples of it that share a packed row (the
    # policy's passes and the critic's): their replies attend to that one copy (a mask, not
    # a copy per sample), so a group of n pays for its prompt once, as the engines do.
    # Exact, like packing; a prompt's rows go into one packed row (longer than the padded
    # length where needed, at most 4x the prompt), and the micro-batch holds fewer rows.
    share_prompts: bool = True
    # Leave out of the train step the rows whose loss and gradient are exactly zero: a row
    # whose advantage is 0 on every token (a group of tied rewards under GRPO-family
    # estimators) under a policy loss that multiplies every term by the advantage (PPO's
    # clip, GSPO, CISPO, ...; not dro, clip_cov, kl_cov), with no KL loss and no entropy
    # bonus. They still count in the loss's normaliser, so the gradient and the update are
    # those of the whole batch, up to float rounding; a late GRPO run that keeps its tied
    # groups (algorithm.filter_uniform_groups=false) trains a fraction of its rows.
    # train/skipped_rows_frac says how many; the token metrics (train/entropy, train/loss,
    # ...) then average over the rows trained, and are absent from a step whose rows were all
    # skipped. Off by default: where the buffer drops tied groups (the grpo preset's
    # algorithm.filter_uniform_groups=true) there is nothing to skip. Refused where no row can
    # be skipped (another loss, an entropy bonus, a KL loss term; the critic).
    skip_zero_advantage: bool = False
    # Compute in this dtype ("bfloat16"), the weights, gradients and AdamW state in model.dtype
    # (fp32 master weights). A sharded fsdp2 model: FSDP2's MixedPrecisionPolicy (layers
    # gathered and run in bf16); one fsdp2 rank and deepspeed: forward passes under
    # torch.autocast. Pays where the hardware has bf16 matmul units (GPUs; CPUs with AMX);
    # several times slower than fp32 on a CPU without. null: all in model.dtype. auto:
    # bfloat16 where the pool's hardware has bf16 units (GPUs; CPUs with AMX or avx512_bf16),
    # else null; decided when the run starts and logged (rlsys/resolve/precision.py).
    mixed_precision: str | None = None
    # With mixed_precision and the model sharded (fsdp2 at world_size > 1): the dtype gradients
    # are reduce-scattered in. float32 sums ranks' bf16 gradients without rounding each partial
    # sum; bfloat16 halves the traffic. deepspeed: its communication_data_type.
    reduce_dtype: str = "float32"
    # Recompute each decoder layer's activations in backward instead of keeping them
    # (torch.utils.checkpoint, non-reentrant, around every layer): only the layers' inputs
    # stay alive between forward and backward, for about one more forward pass of compute.
    activation_checkpointing: bool = False
    # Hold parameters, gradients and optimizer state in host memory and step AdamW there,
    # moving each layer's parameters to the GPU for its forward/backward: fsdp2's
    # CPUOffloadPolicy; deepspeed: ZeRO offload_optimizer (ZeRO-3: and offload_param), the
    # optimizer stepped by DeepSpeedCPUAdam (JIT-compiles once, ~40 s). A CPU learner holds
    # everything in host memory already: fsdp2 ignores it there, deepspeed still runs its
    # offload code (DeepSpeedCPUAdam), which is how CPU tests cover it.
    offload: bool = False
    # torch.compile each decoder layer (inductor; rlsys/models/blocks.py): fuses the layers'
    # element-wise work, 8-25% off a CPU learner's step (bench figures in docs/learners.md).
    # The first step pays the compile (6-25 s on 2 CPU cores; cached for later runs). Needs a
    # C++ compiler on CPU. Not with deepspeed.zero_stage=3 (its parameter hooks run in layers).
    compile: bool = False
    # the torch.compile backend of `compile`: inductor (generates fused kernels: the speed-up),
    # aot_eager (traces forward and backward into graphs and runs them eagerly: no code
    # generation, no C++ compiler, no speed-up; for telling a tracing failure from a code
    # generation one) or eager (dynamo's trace only)
    compile_backend: str = "inductor"
    optim: OptimConfig = field(default_factory=OptimConfig)  # see OptimConfig
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)  # backend=deepspeed
    # resize the group mid-run (schedule; `rlsys scale RUN_DIR learner=N`)
    elastic: GroupElasticConfig = field(default_factory=GroupElasticConfig)

    def __post_init__(self) -> None:
        self.check("learner")

    def check(self, prefix: str) -> None:
        """Validate, naming keys under ``prefix`` (learner, or critic for a value model)."""
        positive(f"{prefix}.world_size", self.world_size)
        positive(f"{prefix}.num_cpus_per_rank", self.num_cpus_per_rank)
        non_negative(f"{prefix}.num_gpus_per_rank", self.num_gpus_per_rank)
        positive(f"{prefix}.num_mini_batches", self.num_mini_batches)
        positive(f"{prefix}.ppo_epochs", self.ppo_epochs)
        positive(f"{prefix}.micro_batch_size", self.micro_batch_size)
        for key in ("max_tokens_per_micro_batch", "logits_chunk_tokens"):
            if getattr(self, key) is not None:
                positive(f"{prefix}.{key}", getattr(self, key))
        if self.mixed_precision is not None:
            one_of(f"{prefix}.mixed_precision", self.mixed_precision, MIXED_PRECISION)
        one_of(f"{prefix}.reduce_dtype", self.reduce_dtype, REDUCE_DTYPES)
        if self.reduce_dtype != "float32" and self.mixed_precision is None:
            raise ConfigError(
                f"{prefix}.reduce_dtype={self.reduce_dtype} only applies with mixed precision "
                f"(gradients are fp32 otherwise): set {prefix}.mixed_precision=bfloat16 or "
                f"{prefix}.reduce_dtype=float32"
            )
        self.optim.check(f"{prefix}.optim")
        self.deepspeed.check(f"{prefix}.deepspeed")
        self.elastic.check(prefix, self.backend, self.world_size)
        one_of(f"{prefix}.compile_backend", self.compile_backend, COMPILE_BACKENDS)
        if self.compile and self.backend == "deepspeed" and self.deepspeed.zero_stage == 3:
            raise ConfigError(
                f"{prefix}.compile=true does not work with {prefix}.deepspeed.zero_stage=3 "
                "(ZeRO-3 gathers parameters in hooks inside every layer): set "
                f"{prefix}.deepspeed.zero_stage=2, {prefix}.backend=fsdp2, or "
                f"{prefix}.compile=false"
            )


@dataclass
class CriticConfig(LearnerConfig):
    """The critic (value model) of PPO, started when ``algorithm.advantage=gae``: a learner
    group of its own (same fields as ``learner``) on a value head over the policy's decoder."""

    world_size: int = 1  # critic ranks (data parallel, sharded)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, warmup_steps=0))
    model_path: str | None = None  # null: the policy's starting weights, with a fresh head
    value_clip: float | None = 0.2  # clip of the value loss around the old values (null: none)
    pretrain_steps: int = 0  # RL steps at the start that train the critic only (policy frozen)

    def __post_init__(self) -> None:
        self.check("critic")
        if self.value_clip is not None:
            positive("critic.value_clip", self.value_clip)
        non_negative("critic.pretrain_steps", self.pretrain_steps)
