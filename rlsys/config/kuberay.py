"""Config of ``launcher=kuberay``: the KubeRay RayJob / RayCluster that ``rlsys submit``
renders from the Hydra config (docs/launching.md, k8s/README.md).

The pod sizes left null here follow from the pools (``rollout.*``, ``learner.*``...): a pod
gets what the Ray actors placed on it ask for. Set them to pin a pod shape (a GPU node's 8
GPUs); the launcher then packs actors into such pods and fails, naming the keys, when they do
not fit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from rlsys.config.checks import non_negative, one_of, positive
from rlsys.config.errors import ConfigError

KINDS = ("RayJob", "RayCluster")
PULL_POLICIES = ("IfNotPresent", "Always", "Never")
ACCESS_MODES = ("ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod")
AUTH_MODES = ("token", "disabled")
TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")
# KubeRay appends 6 characters to a RayJob's name for its cluster, whose name must stay a
# DNS-1035 label of at most 53 characters (its validation of RayJob / RayCluster names).
MAX_NAME = {"RayJob": 47, "RayCluster": 53}
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
# The usual spellings of a Kubernetes quantity (16Gi, 500M, 1.5Ti): a subset of the API's.
QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?([KMGTPE]i|[kMGTPE])?")
UNITS = {"": 1, **{u: 1000**i for i, u in enumerate("kMGTPE", 1)}}
UNITS.update({f"{u}i": 1024**i for i, u in enumerate("KMGTPE", 1)})


def check_quantity(key: str, value: str) -> None:
    """A memory or storage size such as 16Gi."""
    if not QUANTITY.fullmatch(str(value)):
        raise ConfigError(
            f"{key}={value!r} is not a Kubernetes quantity; write it like 16Gi or 500Mi"
        )


def quantity_bytes(value: str) -> int:
    """Bytes of a quantity ``check_quantity`` accepts (16Gi, 500M, 1.5Ti), rounded up."""
    match = QUANTITY.fullmatch(value)
    if match is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity such as 16Gi")
    unit = match.group(2) or ""
    return math.ceil(Decimal(value[: len(value) - len(unit)]) * UNITS[unit])


def check_shm(prefix: str, memory: str | None, shm_size: str | None) -> None:
    """A /dev/shm size that is a quantity and fits in the pod's memory."""
    if shm_size is None:
        return
    check_quantity(f"{prefix}.shm_size", shm_size)
    if quantity_bytes(shm_size) == 0:
        raise ConfigError(f"{prefix}.shm_size=0 leaves no /dev/shm; give a size such as 16Gi")
    if memory is not None and quantity_bytes(shm_size) > quantity_bytes(memory):
        raise ConfigError(
            f"{prefix}.shm_size={shm_size} exceeds {prefix}.memory={memory}: /dev/shm is "
            f"memory of the pod, counted against its limit; lower {prefix}.shm_size or raise "
            f"{prefix}.memory (null sizes it as the processes' estimate plus shm_size)"
        )


def check_tolerations(key: str, tolerations: list[dict[str, Any]]) -> None:
    """Each toleration names only fields of a Kubernetes toleration."""
    for item in tolerations:
        bad = sorted(set(item) - set(TOLERATION_KEYS))
        if bad:
            raise ConfigError(
                f"{key} has a toleration with {bad}; a toleration takes only "
                f"{list(TOLERATION_KEYS)}, e.g. {{key:nvidia.com/gpu,operator:Exists,"
                "effect:NoSchedule}"
            )
        seconds = item.get("tolerationSeconds")
        if seconds is not None and not str(seconds).isdigit():
            raise ConfigError(f"{key}: tolerationSeconds={seconds!r} must be a whole number")


@dataclass
class HeadConfig:
    """The head pod: Ray's head and, for a RayJob, the run's driver (the controller). It
    advertises no CPUs to Ray, so no actor lands on it."""

    cpus: int = 2  # CPU request = limit of the head pod (driver, GCS, dashboard)
    memory: str = "8Gi"  # memory request = limit (Kubernetes quantity), /dev/shm included
    # The head's /dev/shm, as the worker groups' shm_size: the driver's ray.put objects live
    # in the head's object store (null: a third of memory).
    shm_size: str | None = None
    # Label and toleration values are Any, not str, so that {gpu:true} stays the label value
    # "true" (a str field would turn Hydra's boolean into "True").
    node_selector: dict[str, Any] = field(default_factory=dict)  # pod nodeSelector
    tolerations: list[dict[str, Any]] = field(default_factory=list)  # pod tolerations

    def check(self, prefix: str) -> None:
        """Validate, naming keys under ``prefix``."""
        positive(f"{prefix}.cpus", self.cpus)
        check_quantity(f"{prefix}.memory", self.memory)
        check_shm(prefix, self.memory, self.shm_size)
        check_tolerations(f"{prefix}.tolerations", self.tolerations)


@dataclass
class WorkerGroupConfig:
    """One KubeRay worker group: identical pods that host one or more pools' actors."""

    # Pods (null: the fewest whose per-pod cpus/gpus below fit the actors; when those are
    # null too, one actor of each pool per pod).
    replicas: int | None = None
    # CPUs per pod: the pod's request = limit and Ray's num-cpus (null: what the actors
    # placed on one pod ask for, rounded up).
    cpus: int | None = None
    gpus: int | None = None  # GPUs per pod, as cpus (null: what its actors ask for, rounded up)
    # Per pod, e.g. 64Gi, /dev/shm included (null: 4Gi per CPU + 16Gi per GPU for the
    # processes, plus shm_size).
    memory: str | None = None
    # Per pod: size of /dev/shm, a memory-backed emptyDir, where Ray keeps its object store
    # and NCCL's shared-memory transport, vLLM's tensor-parallel broadcast and torch's shared
    # CPU tensors put their buffers (Kubernetes gives a container 64Mi; KubeRay's operator,
    # when a manifest has none, adds one as large as memory). Its pages count against memory.
    # null: a third of memory (both null: half the processes' estimate), just above the 30%
    # Ray's object store takes by default, which Ray moves to /tmp (slow) when /dev/shm
    # cannot hold it.
    shm_size: str | None = None
    node_selector: dict[str, Any] = field(default_factory=dict)  # e.g. {pool:rollout}
    # e.g. [{key:nvidia.com/gpu,operator:Exists,effect:NoSchedule}]
    tolerations: list[dict[str, Any]] = field(default_factory=list)

    def check(self, prefix: str) -> None:
        """Validate, naming keys under ``prefix``."""
        if self.replicas is not None:
            positive(f"{prefix}.replicas", self.replicas)
        if self.cpus is not None:
            positive(f"{prefix}.cpus", self.cpus)
        if self.gpus is not None:
            non_negative(f"{prefix}.gpus", self.gpus)
        if self.memory is not None:
            check_quantity(f"{prefix}.memory", self.memory)
        check_shm(prefix, self.memory, self.shm_size)
        check_tolerations(f"{prefix}.tolerations", self.tolerations)


@dataclass
class VolumeConfig:
    """The volume every pod mounts: run directories (checkpoints) and the rlsys cache (the
    built-in model, the warm start), which every pod of a multi-pod run must see."""

    # PersistentVolumeClaim mounted at mount_path (null: no volume; runs vanish with the pods,
    # and actors on other pods cannot read a built-in model or warm start built on the head).
    claim: str | None = "rlsys-runs"
    create: bool = True  # render the claim too (false: it exists already, e.g. made by an admin)
    size: str = "100Gi"  # requested storage of a created claim
    storage_class: str | None = None  # storage class of a created claim (null: the default)
    # Every pod mounts it, across nodes: ReadWriteMany (NFS, CephFS, Filestore, EFS...).
    access_mode: str = "ReadWriteMany"
    mount_path: str = "/mnt/rlsys"  # a relative run.output_dir and the cache go under it

    def check(self, prefix: str) -> None:
        """Validate, naming keys under ``prefix``."""
        if self.claim is not None and not DNS_1035.fullmatch(self.claim):
            raise ConfigError(
                f"{prefix}.claim={self.claim!r} is not a valid claim name; use lower-case "
                "letters, digits and '-', starting with a letter"
            )
        check_quantity(f"{prefix}.size", self.size)
        one_of(f"{prefix}.access_mode", self.access_mode, ACCESS_MODES)
        if not self.mount_path.startswith("/"):
            raise ConfigError(
                f"{prefix}.mount_path={self.mount_path!r} must be an absolute path, e.g. /mnt/rlsys"
            )


@dataclass
class KubeRayConfig:
    """The KubeRay RayJob (the run on a cluster of its own) or RayCluster (a cluster to submit
    runs to with ``launcher=ray_job``) rendered from the run's config."""

    kind: str = "RayJob"  # RayJob | RayCluster
    # metadata.name (null: run.name made a valid name, else rlsys-<UTC time of submission>);
    # also `rlsys status` / `rlsys stop`'s JOB_ID.
    name: str | None = None
    namespace: str = "default"  # Kubernetes namespace of every rendered object
    image: str = "rlsys:gpu"  # image of head and workers (docker/gpu.Dockerfile or cpu.Dockerfile)
    image_pull_policy: str = "IfNotPresent"  # IfNotPresent | Always | Never
    service_account: str | None = None  # pods' serviceAccountName (null: the namespace default)
    # spec.rayVersion: the Ray inside the image; KubeRay gates features on it (token auth
    # needs >= 2.52). Check with: docker run --rm IMAGE ray --version
    ray_version: str = "2.60.0"
    gpu_resource: str = "nvidia.com/gpu"  # extended resource name of a GPU (amd.com/gpu...)
    # spec.authOptions.mode: "token" has KubeRay (>= 1.5.1, Ray >= 2.52) make a token Secret
    # named like the cluster and require it on the dashboard and GCS; "disabled": no auth.
    auth_mode: str = "token"
    # Secret whose keys below become environment variables of every Ray container (null:
    # none). Keys missing from it, or the Secret itself, are skipped (optional), so one Secret
    # serves runs with and without a tracker.
    secret: str | None = "rlsys-tracking"
    # Keys of that Secret passed on as env vars (each optional).
    secret_keys: list[str] = field(
        default_factory=lambda: ["WANDB_API_KEY", "WANDB_BASE_URL", "HF_TOKEN"]
    )
    env: dict[str, Any] = field(default_factory=dict)  # more env vars of every Ray container
    # RayJob: delete the cluster this many seconds after the job ends (keeps logs a while).
    ttl_seconds_after_finished: int = 600
    backoff_limit: int = 0  # RayJob: retries of a failed job, each on a new cluster
    head: HeadConfig = field(default_factory=HeadConfig)
    # placement.mode=disaggregated: the rollout pool's pods, and the learner's (which also
    # host the critic and the reference policy, as placement.learner_resources does).
    rollout: WorkerGroupConfig = field(default_factory=WorkerGroupConfig)
    learner: WorkerGroupConfig = field(default_factory=WorkerGroupConfig)
    # placement.mode=colocated: the one group whose pods every pool shares.
    workers: WorkerGroupConfig = field(default_factory=WorkerGroupConfig)
    volume: VolumeConfig = field(default_factory=VolumeConfig)

    def __post_init__(self) -> None:
        prefix = "launcher.kuberay"
        one_of(f"{prefix}.kind", self.kind, KINDS)
        if self.name is not None:
            check_name(f"{prefix}.name", self.name, self.kind)
        if not DNS_1035.fullmatch(self.namespace):
            raise ConfigError(
                f"{prefix}.namespace={self.namespace!r} is not a namespace name; use "
                "lower-case letters, digits and '-'"
            )
        if not self.image:
            raise ConfigError(f"{prefix}.image is empty; set it to the image you pushed")
        one_of(f"{prefix}.image_pull_policy", self.image_pull_policy, PULL_POLICIES)
        one_of(f"{prefix}.auth_mode", self.auth_mode, AUTH_MODES)
        non_negative(f"{prefix}.ttl_seconds_after_finished", self.ttl_seconds_after_finished)
        non_negative(f"{prefix}.backoff_limit", self.backoff_limit)
        self.head.check(f"{prefix}.head")
        for group in ("rollout", "learner", "workers"):
            getattr(self, group).check(f"{prefix}.{group}")
        self.volume.check(f"{prefix}.volume")


def check_name(key: str, name: str, kind: str) -> None:
    """A RayJob / RayCluster name KubeRay accepts."""
    if not DNS_1035.fullmatch(name) or len(name) > MAX_NAME[kind]:
        raise ConfigError(
            f"{key}={name!r} is not a valid {kind} name: at most {MAX_NAME[kind]} lower-case "
            "letters, digits and '-', starting with a letter; pick such a name"
        )
