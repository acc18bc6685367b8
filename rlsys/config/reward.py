"""Config of the reward layer (``reward.*``): which rewards score a completion, where they
run, and the limits of sandboxed code execution. See docs/rewards.md."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from rlsys.config.checks import non_negative, one_of, positive
from rlsys.config.errors import ConfigError
from rlsys.config.learner import DeepSpeedConfig, LearnerConfig


@dataclass
class SandboxConfig:
    """``reward.sandbox``: limits on model-written code run by code rewards (``code_tests``)."""

    wall_s: float = 5.0  # wall-clock seconds per program run (then it is killed)
    # CPU seconds of the whole sandbox (all its processes together), and of each process
    # (RLIMIT_CPU)
    cpu_s: float = 4.0
    # Private memory of the whole sandbox (all its processes together), MiB; also each
    # process's address space (RLIMIT_AS)
    memory_mb: int = 512
    max_processes: int = 16  # processes/threads of the sandbox user (RLIMIT_NPROC)
    file_size_mb: int = 8  # largest file the program may write (RLIMIT_FSIZE), MiB
    disk_mb: int = 32  # all files the program writes together (its directory is a tmpfs), MiB
    # Without namespaces (no jail, no network cut-off) code rewards refuse to run; true runs
    # the code anyway, unjailed and online, with per-process rlimits only (docs/rewards.md).
    unsafe_no_isolation: bool = False

    def __post_init__(self) -> None:
        for key in ("wall_s", "cpu_s", "memory_mb", "max_processes", "file_size_mb", "disk_mb"):
            positive(f"reward.sandbox.{key}", getattr(self, key))


@dataclass
class RewardModelConfig:
    """``reward.model``: sequence-classification reward models scoring (prompt, completion)."""

    paths: list[str] = field(default_factory=list)  # HF dirs or hub ids; several: an ensemble
    ensemble: str = "mean"  # how an ensemble's scores combine: mean | min
    weight: float = 1.0  # weight of the (ensembled) score in the total reward
    # ranks per reward model (an inference-only learner group): > 1 shards it over them
    world_size: int = 1
    # how a model is sharded over its ranks: fsdp2 or deepspeed (ZeRO-3)
    backend: str = "fsdp2"
    num_cpus: float = 1.0  # per rank (also its torch thread count)
    num_gpus: float = 0.0  # per rank
    dtype: str = "float32"  # reward model weights: float32 | bfloat16 | float16 (not deepspeed)
    # sequences per forward pass (each at most max_length tokens: no further token budget)
    batch_size: int = 32
    max_length: int = 512  # longer prompt + completion pairs are truncated from the left

    def __post_init__(self) -> None:
        one_of("reward.model.ensemble", self.ensemble, ("mean", "min"))
        one_of("reward.model.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        positive("reward.model.world_size", self.world_size)
        positive("reward.model.num_cpus", self.num_cpus)
        non_negative("reward.model.num_gpus", self.num_gpus)
        positive("reward.model.batch_size", self.batch_size)
        positive("reward.model.max_length", self.max_length)

    def group(self) -> LearnerConfig:
        """The learner-group config each reward model's ranks are built from (inference-only:
        no optimizer; ZeRO-3 for DeepSpeed, the stage that shards parameters)."""
        return LearnerConfig(
            backend=self.backend,
            world_size=self.world_size,
            num_cpus_per_rank=self.num_cpus,
            num_gpus_per_rank=self.num_gpus,
            micro_batch_size=self.batch_size,
            # batch_size rows of at most max_length tokens, as the key says (a score head has
            # no (B, T, V) logits to slice)
            max_tokens_per_micro_batch=self.batch_size * self.max_length,
            deepspeed=DeepSpeedConfig(zero_stage=3),
        )


JUDGE_RUBRIC = (
    "You grade an answer to a task.\nTask: {prompt}\nReference answer: {answer}\n"
    "Answer to grade: {completion}\nIs the answer correct and complete? Reply with one line, "
    "SCORE: <an integer from 0 (wrong) to 10 (fully right)>."
)


@dataclass
class JudgeConfig:
    """``reward.judge``: an LLM judge scores each completion through an OpenAI-compatible chat
    endpoint (vLLM's server, a hosted API); its score, the verdict's number over ``max_score``
    in [0, 1], is added to the total with ``weight`` (rlsys/rewards/judge.py)."""

    # The API's base URL, e.g. http://127.0.0.1:8000/v1; several, comma-separated, share the
    # requests round-robin (None: no judge, unless model_path starts one)
    url: str | None = None
    model: str = "judge"  # the model name the endpoint serves
    # A judge the run serves itself (instead of url): an HF directory, hub id or rlsys model
    # path (gguf:smollm2-135m-instruct) on num_workers rlsys engines behind OpenAI-compatible
    # endpoints (rlsys/rewards/judge_pool.py)
    model_path: str | None = None
    engine: str = "hf"  # the served judge's engine: hf | vllm
    dtype: str = "float32"  # the served judge's weights
    num_workers: int = 1  # servers of the served judge
    num_cpus: float = 1.0  # per server (also its torch threads)
    num_gpus: float = 0.0  # per server
    # The start of the judge's reply, sent as a last assistant message the judge continues
    # (vLLM's continue_final_message); the verdict is looked for in it + the reply. "SCORE: "
    # makes a small judge answer with a number.
    prefill: str = ""
    api_key_env: str | None = "OPENAI_API_KEY"  # sent as a Bearer token where it is set
    weight: float = 1.0  # weight of the judge's score in the total reward
    # The user message; {prompt}, {completion} and {answer} (the row's answer, "" if none)
    # are filled in.
    rubric: str = JUDGE_RUBRIC
    verdict_pattern: str = r"(?i)score\s*[:=]?\s*(-?\d+(?:\.\d+)?)"  # group 1: the number
    max_score: float = 10.0  # the verdict's number is divided by this and clipped to [0, 1]
    max_tokens: int = 32  # of the judge's reply
    temperature: float = 0.0  # of the judge's sampling (0: greedy, the same grade each time)
    concurrency: int = 8  # requests in flight at once
    timeout_s: float = 30.0  # per batch of `concurrency` requests, retries included
    retries: int = 2  # after a connection error, timeout, 429 or 5xx
    cache: bool = True  # an identical (prompt, completion, answer) is judged once per process
    # More fields of the request body, e.g. vLLM's
    # {structured_outputs: {regex: "SCORE: [0-9]|SCORE: 10"}} to force a parsable verdict.
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for url in self.urls():
            if not url.startswith(("http://", "https://")):
                raise ConfigError(
                    f"reward.judge.url={self.url!r}: {url!r} is not an http:// or https:// URL; "
                    "give the OpenAI-compatible API's base, e.g. "
                    "reward.judge.url=http://127.0.0.1:8000/v1"
                )
        if self.url is not None and self.model_path is not None:
            raise ConfigError(
                f"reward.judge.url={self.url!r} and reward.judge.model_path="
                f"{self.model_path!r} both say where the judge is; set one of them"
            )
        one_of("reward.judge.engine", self.engine, ("hf", "vllm"))
        one_of("reward.judge.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        positive("reward.judge.num_workers", self.num_workers)
        positive("reward.judge.num_cpus", self.num_cpus)
        non_negative("reward.judge.num_gpus", self.num_gpus)
        for key in ("max_score", "max_tokens", "concurrency", "timeout_s"):
            positive(f"reward.judge.{key}", getattr(self, key))
        non_negative("reward.judge.retries", self.retries)
        non_negative("reward.judge.temperature", self.temperature)
        for name in ("prompt", "completion"):
            if "{" + name + "}" not in self.rubric:
                raise ConfigError(
                    f"reward.judge.rubric has no {{{name}}}; the judge would not see the "
                    f"{name}: put {{{name}}} where it goes"
                )
        try:
            groups = re.compile(self.verdict_pattern).groups
        except re.error as exc:
            raise ConfigError(
                f"reward.judge.verdict_pattern={self.verdict_pattern!r} is not a regex ({exc})"
            ) from None
        if groups < 1:
            raise ConfigError(
                f"reward.judge.verdict_pattern={self.verdict_pattern!r} has no group; capture "
                "the verdict's number in group 1, e.g. score:\\s*(\\d+)"
            )

    def urls(self) -> list[str]:
        """The endpoints of ``url`` (none where it is unset)."""
        return [u.strip() for u in (self.url or "").split(",") if u.strip()]


@dataclass
class RewardConfig:
    """``reward``: the total reward of a completion is ``reward.weight`` x the task's verifier
    (``task.reward``, or ``reward.fn``) + sum of ``reward.extra`` weights x their rewards
    (+ ``reward.model.weight`` x the reward model). ``correct`` is the verifier's verdict."""

    # A user reward function replacing task.reward: "path/to/file.py:function", called with
    # (prompt, completion, metadata) and returning a float or a dict with "reward" (sync or
    # async).
    fn: str | None = None
    # A reward service over HTTP replacing task.reward: batches of prompt/completion/metadata
    # POSTed as JSON, one score per item back (protocol: rlsys/rewards/remote.py). Sent in
    # chunks of reward.batch_size, each within reward.timeout_s.
    url: str | None = None
    url_retries: int = 2  # retries of a batch after a connection error, timeout, 429 or 5xx
    url_key_env: str | None = "RLSYS_REWARD_API_KEY"  # sent as a Bearer token where it is set
    weight: float = 1.0  # weight of the verifier (task.reward / reward.fn)
    # More registered rewards added to the total, name -> weight, e.g. {format: 0.1}.
    extra: dict[str, float] = field(default_factory=dict)
    # The verifier per row by its `data_source` column (verl's datasets), source -> registered
    # reward, e.g. {openai/gsm8k: gsm8k, lighteval/MATH: math_verify}; rows of other sources,
    # or with none, are scored by task.reward (rlsys/rewards/routing.py).
    by_source: dict[str, str] = field(default_factory=dict)
    format_pattern: str = r"(?s)\s*\S.*"  # the `format` reward: 1 when the whole completion matches
    timeout_s: float = 10.0  # per reward call; a timeout scores 0 and counts an error
    # Reward worker actors scoring batches of samples (0: threads of the controller process).
    num_workers: int = 0
    num_cpus_per_worker: float = 1.0  # CPUs per reward worker actor (fractions allowed)
    batch_size: int = 16  # samples per call to a reward worker
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    model: RewardModelConfig = field(default_factory=RewardModelConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    # A registered reward's own settings, by reward name then setting name, over what the flat
    # keys above give it (each reward's settings class lists them), e.g. {format: {pattern:
    # '.*[0-9]'}}; a reward added in a plugin takes all of its settings here.
    args: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.fn is not None and ":" not in self.fn:
            raise ConfigError(
                f"reward.fn={self.fn!r} must be 'path/to/file.py:function', e.g. "
                "reward.fn=my_rewards.py:score"
            )
        if self.url is not None:
            if self.fn is not None:
                raise ConfigError(
                    f"reward.fn={self.fn!r} and reward.url={self.url!r} both replace the task's "
                    "verifier; set one of them"
                )
            if not self.url.startswith(("http://", "https://")):
                raise ConfigError(
                    f"reward.url={self.url!r} is not an http:// or https:// URL; give the "
                    "reward service's endpoint, e.g. reward.url=http://127.0.0.1:8000/score"
                )
        if self.by_source and (self.fn is not None or self.url is not None):
            which = "reward.fn" if self.fn is not None else "reward.url"
            raise ConfigError(
                f"reward.by_source and {which} both choose the verifier; {which} receives each "
                "row's data_source in its metadata and can route by it: drop reward.by_source"
            )
        for source, name in self.by_source.items():
            if not isinstance(name, str) or not name:
                raise ConfigError(
                    f"reward.by_source.{source}={name!r} is not a reward's name; name a "
                    f"registered reward, e.g. reward.by_source.{source}=math_verify"
                )
        non_negative("reward.url_retries", self.url_retries)
        positive("reward.timeout_s", self.timeout_s)
        non_negative("reward.num_workers", self.num_workers)
        positive("reward.num_cpus_per_worker", self.num_cpus_per_worker)
        positive("reward.batch_size", self.batch_size)
        for name in self.extra:
            if not isinstance(name, str) or not name:
                raise ConfigError(f"reward.extra has a bad name {name!r}; use a reward's name")
