"""Typed configuration: the root ``TrainConfig`` and the configs of every component.

Every default lives in a dataclass of ``rlsys/config/`` (this module, ``learner.py`` and
``algorithm.py``); import them all from here. Each dataclass is one component's config; a
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
from rlsys.config.preference import DPOConfig, PreferenceDataConfig, RMConfig
from rlsys.config.recovery import CheckpointConfig, FaultConfig, check_resume
from rlsys.config.reward import RewardConfig
from rlsys.config.shapes import ShapesConfig
from rlsys.config.tree import TreeConfig


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
class LoraConfig:
    """Low-rank adapters (LoRA, Hu et al. 2021, built with PEFT) on the policy: the learner
    trains only the adapters (optimizer state for them alone), weight sync sends only them
    and each engine merges them into its copy of the base weights, and a KL term's reference
    is the learner's own base model with the adapters off (see ``reference.from_lora_base``).
    ``rlsys sft`` / ``rm`` / ``dpo`` take the same keys."""

    rank: int = 0  # adapter rank r; 0: off (full fine-tuning)
    alpha: float = 32.0  # the update is (alpha / rank) * B @ A
    dropout: float = 0.0  # dropout on each adapter's input while training
    # the nn.Linear modules (by name suffix) that get adapters: every linear layer of the
    # attention and MLP blocks of Llama/Qwen/Mistral-style models; set your own for others
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))

    def __post_init__(self) -> None:
        non_negative("model.lora.rank", self.rank)
        positive("model.lora.alpha", self.alpha)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.lora.dropout={self.dropout} must be in [0, 1)")
        if self.rank and not self.target_modules:
            raise ConfigError(
                "model.lora.target_modules is empty: name the linear modules that get "
                f"adapters, e.g. {list(LORA_TARGETS)}"
            )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        """What the adapter's product B @ A is multiplied by."""
        return self.alpha / self.rank


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class ModelConfig:
    """The policy model: a built-in tiny model, a local HF directory or a hub id."""

    path: str = "builtin:tiny"  # "builtin:<name>", a local directory, or a hub id
    dtype: str = "float32"  # parameter dtype on the learner and engines
    # Built-in models only: the architecture (Qwen2-style decoder, random init).
    hidden_size: int = 128  # width of the residual stream
    num_layers: int = 2  # decoder layers
    num_heads: int = 4  # attention heads (head_dim = hidden_size / num_heads >= 32)
    num_kv_heads: int = 2  # key/value heads (grouped-query attention)
    intermediate_size: int = 512  # MLP width
    max_position_embeddings: int = 256  # longest prompt + response in tokens
    tie_word_embeddings: bool = False  # Qwen2 default; tied embeddings slow a tiny model down
    # Vision-language models (builtin:tiny-vl, a Qwen2-VL directory): false trains the vision
    # tower too and weight syncs carry it; true keeps it as loaded and never sends it
    freeze_vision: bool = True
    lora: LoraConfig = field(default_factory=LoraConfig)  # low-rank adapters (rank 0: off)

    def __post_init__(self) -> None:
        one_of("model.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        for key in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "max_position_embeddings",
        ):
            positive(f"model.{key}", getattr(self, key))
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"model.hidden_size={self.hidden_size} is not divisible by "
                f"model.num_heads={self.num_heads}; pick sizes that divide"
            )
        head_dim = self.hidden_size // self.num_heads
        if head_dim < 32:
            raise ConfigError(
                f"model.hidden_size / model.num_heads = {head_dim}: head_dim must be >= 32 "
                "(vLLM kernels need it); lower model.num_heads or raise model.hidden_size"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model.num_heads={self.num_heads} is not a multiple of "
                f"model.num_kv_heads={self.num_kv_heads}; make it one"
            )


@dataclass
class TaskConfig:
    """The verifiable task: a built-in arithmetic family, a jsonl/parquet dataset, or the
    prompts of a built-in environment (word_problems, guess_number, sql, search; see
    ``task.env``), or the RLHF example's review continuations (reviews; see
    ``rlsys.data.reviews``)."""

    # arithmetic | arithmetic_scratchpad | file | word_problems | guess_number | sql | search | reviews
    name: str = "arithmetic"
    reward: str = "exact_match"  # reward function from the rewards registry
    # Arithmetic difficulty knobs.
    digits: int = 2  # operands have 1..digits digits
    operators: list[str] = field(default_factory=lambda: ["+"])  # any of + - *
    # arithmetic_scratchpad: how many operands a sum chains (each count equally likely)
    operand_counts: list[int] = field(default_factory=lambda: [3, 4])
    reverse_answer: bool = True  # write the zero-padded answer least-significant digit first
    pad_operands: bool = False  # true: "05+29=" (one prompt shape for every problem)
    # How an arithmetic problem reads: "compact" is "a+b=" with the answer written as above
    # (for built-in models); "question" is "What is a + b?" with a plain decimal answer (for
    # pretrained chat models, with chat_template and a last_number/boxed reward).
    style: str = "compact"
    train_size: int = 9500  # distinct training problems
    eval_size: int = 500  # held-out problems (file tasks: held out of train_path if no eval_path)
    # File datasets (task.name=file).
    train_path: str | None = None  # .jsonl or .parquet
    eval_path: str | None = None  # null: hold out eval_size rows of train_path
    prompt_key: str = "prompt"  # column holding the prompt text
    answer_key: str = "answer"  # column holding the ground truth
    # column holding an image (a path, encoded bytes or a data:image/...;base64 URL, or a
    # list of them), shown before the prompt text; null: text only. Needs a VL model.
    image_key: str | None = None
    shapes: ShapesConfig = field(default_factory=ShapesConfig)  # task.name=shapes only
    # Longer prompts (as formatted: chat template, instruction, image tokens) are left out,
    # counted, with a warning per split naming how many and the longest. null: what the
    # model's context leaves a prompt, resolved when a command loads the model: its
    # max_position_embeddings (the text config's; at most rollout.vllm.max_model_len) minus
    # the response bound (the task's max_new_tokens, eval.max_new_tokens if larger; with
    # task.env a whole trajectory's: env.max_total_tokens, or max_new_tokens x max_turns)
    max_prompt_tokens: int | None = None
    max_new_tokens: int | None = None  # null: the task's own bound (arithmetic: answer + EOS)
    # Prompt formatting (any task): what the model sees around each prompt's text.
    instruction: str | None = None  # appended to every prompt, e.g. how to give the answer
    chat_template: bool = False  # send the prompt as a user turn of the tokenizer's template
    system_prompt: str | None = None  # chat only: the system turn (null: the template's own)
    env: EnvConfig = field(default_factory=EnvConfig)  # multi-turn environment (null: none)

    def __post_init__(self) -> None:
        one_of("task.style", self.style, ("compact", "question"))
        if self.style != "compact" and self.reverse_answer:
            raise ConfigError(
                f"task.reverse_answer=true only applies to task.style=compact, not "
                f"task.style={self.style}; set task.reverse_answer=false"
            )
        for key in ("instruction", "system_prompt"):
            value = getattr(self, key)
            if value is not None and not value.strip():
                raise ConfigError(f"task.{key}={value!r} is blank; give it text or set it to null")
        if self.system_prompt is not None and not self.chat_template:
            raise ConfigError(
                "task.system_prompt needs task.chat_template=true (a system turn only exists "
                "in a chat template); set task.chat_template=true or task.system_prompt=null"
            )
        positive("task.digits", self.digits)
        positive("task.train_size", self.train_size)
        positive("task.eval_size", self.eval_size)
        if self.max_prompt_tokens is not None:
            positive("task.max_prompt_tokens", self.max_prompt_tokens)
        if self.max_new_tokens is not None:
            positive("task.max_new_tokens", self.max_new_tokens)
        if not self.operand_counts or any(c < 2 for c in self.operand_counts):
            raise ConfigError(
                f"task.operand_counts={list(self.operand_counts)} must be a non-empty list of "
                "counts >= 2 (a sum needs two operands); e.g. task.operand_counts=[3,4]"
            )
        bad = [op for op in self.operators if op not in ("+", "-", "*")]
        if bad or not self.operators:
            raise ConfigError(
                f"task.operators={list(self.operators)} must be a non-empty subset of "
                "['+', '-', '*']"
            )
        if self.env.tool_format in ("hermes", "smollm2") and not self.chat_template:
            raise ConfigError(
                f"task.env.tool_format={self.env.tool_format} needs task.chat_template=true (its "
                "tools are declared and its results sent as turns of the chat template); set "
                "task.chat_template=true or task.env.tool_format=compact (or auto)"
            )
        if self.env.name == AGENT_ENV and not self.chat_template:
            raise ConfigError(
                f"task.env.name={AGENT_ENV} renders the agent's messages with the chat "
                "template; set task.chat_template=true (with a model whose tokenizer has one)"
            )
        if self.reward == "env" and self.env.name is None:
            raise ConfigError(
                "task.reward=env scores with the environment's reward, but task.env.name is "
                "null; set task.env.name (calculator | guess_number | sql | search) or another "
                "task.reward"
            )
        if self.name == "file" and not self.train_path:
            raise ConfigError("task.name=file needs task.train_path=<file.jsonl|file.parquet>")


@dataclass
class VLLMConfig:
    """vLLM engine settings (``rollout.engine=vllm``); ignored by the HF engine."""

    tensor_parallel_size: int = 1  # GPUs (or CPU processes) one engine shards its model over
    gpu_memory_utilization: float = 0.5  # GPU: fraction of GPU memory for weights + KV cache
    cpu_kv_cache_gb: int = 1  # CPU: GiB of KV cache per engine (VLLM_CPU_KVCACHE_SPACE)
    max_model_len: int | None = None  # longest prompt + response; null: the model's limit
    max_num_seqs: int = 256  # sequences decoded together in one engine step
    enforce_eager: bool = True  # GPU: true skips CUDA-graph capture (faster start, slower decode)
    enable_prefix_caching: bool = True  # share the KV cache of a prompt's n samples
    warmup: bool = True  # one short generation at start-up, so step 1 is not the slow one
    cpu_threads_bind: str = "nobind"  # CPU: VLLM_CPU_OMP_THREADS_BIND ("auto" pins cores)

    def __post_init__(self) -> None:
        positive("rollout.vllm.tensor_parallel_size", self.tensor_parallel_size)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(
                f"rollout.vllm.gpu_memory_utilization={self.gpu_memory_utilization} must be "
                "in (0, 1]"
            )
        positive("rollout.vllm.cpu_kv_cache_gb", self.cpu_kv_cache_gb)
        if self.max_model_len is not None:
            positive("rollout.vllm.max_model_len", self.max_model_len)
        positive("rollout.vllm.max_num_seqs", self.max_num_seqs)


@dataclass
class RolloutConfig:
    """The rollout pool: generation engines in Ray actors."""

    engine: str = "hf"  # "hf" (transformers generate) or "vllm" (vLLM; vllm-cpu on CPU)
    num_workers: int = 1  # rollout worker actors
    num_cpus_per_worker: float = 2.0  # also the torch thread count of each worker
    num_gpus_per_worker: float = 0.0  # GPUs per rollout worker (0: CPU)
    n_samples: int = 8  # completions per prompt (the GRPO group size)
    temperature: float = 1.0  # sampling temperature; learner logprobs use the same
    top_p: float = 1.0  # nucleus sampling mass (1: full distribution)
    micro_batch_size: int = 512  # HF engine: sequences per generate() call
    dtype: str | None = None  # engine weights dtype; null: model.dtype (e.g. fp32 learner, bf16)
    stop: list[str] = field(default_factory=list)  # stop strings (kept in the completion)
    stop_token_ids: list[int] = field(default_factory=list)  # stop tokens besides EOS
    # A weight update while requests run: false finishes them on the old weights first; true
    # aborts them and continues each sample's prefix under the new weights (partial rollouts;
    # every token keeps the version that produced it). A stop string that straddles the
    # abort point is not detected.
    partial_rollouts: bool = False
    # Prompts per generation call of a rollout loop; null: data.batch_size / num_workers
    # (one call per worker per batch). Smaller calls stream groups to scoring sooner.
    prompts_per_request: int | None = None
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    tree: TreeConfig = field(default_factory=TreeConfig)  # tree rollouts (TreePO); off: flat
    elastic: ElasticConfig = field(default_factory=ElasticConfig)  # resize the pool mid-run

    def __post_init__(self) -> None:
        scale = self.elastic.autoscale
        if scale.enabled and not scale.min_workers <= self.num_workers <= scale.max_workers:
            raise ConfigError(
                f"rollout.num_workers={self.num_workers} is outside rollout.elastic.autoscale's "
                f"[min_workers, max_workers] = [{scale.min_workers}, {scale.max_workers}]; start "
                "within the range or widen it"
            )
        positive("rollout.num_workers", self.num_workers)
        positive("rollout.num_cpus_per_worker", self.num_cpus_per_worker)
        non_negative("rollout.num_gpus_per_worker", self.num_gpus_per_worker)
        positive("rollout.n_samples", self.n_samples)
        positive("rollout.temperature", self.temperature)
        positive("rollout.micro_batch_size", self.micro_batch_size)
        if self.prompts_per_request is not None:
            positive("rollout.prompts_per_request", self.prompts_per_request)
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.top_p={self.top_p} must be in (0, 1]")
        if self.dtype is not None:
            one_of("rollout.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError(f"rollout.stop={list(self.stop)} must be non-empty strings")
        if self.tree.enabled and self.partial_rollouts:
            raise ConfigError(
                "rollout.tree.enabled=true with rollout.partial_rollouts=true is not supported "
                "(a tree's segments are generated in rounds, and an aborted one would have to "
                "be continued inside a round); set one of them to false"
            )
        tp = self.vllm.tensor_parallel_size
        if (
            self.engine == "vllm"
            and self.num_gpus_per_worker > 0
            and self.num_gpus_per_worker != tp
        ):
            raise ConfigError(
                f"rollout.num_gpus_per_worker={self.num_gpus_per_worker:g} but "
                f"rollout.vllm.tensor_parallel_size={tp}: a tensor-parallel engine needs one GPU "
                "per shard; make them equal"
            )


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

    def __post_init__(self) -> None:
        positive("eval.num_prompts", self.num_prompts)
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
