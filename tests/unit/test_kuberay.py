"""KubeRay launcher: rendered manifests validate against the KubeRay CRDs' schema facts
(tests/fixtures/kuberay_schema.json, cut from the CRDs by scripts/kuberay_schema.py; no cluster here),
pools reach their worker groups, the committed k8s/ files are current, and kubectl is driven
as documented (a fake kubectl script records what it is given)."""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import jsonschema
import pytest
import yaml

from rlsys.cli import main
from rlsys.config import ConfigError
from rlsys.config.kuberay import (
    HeadConfig,
    KubeRayConfig,
    VolumeConfig,
    WorkerGroupConfig,
    quantity_bytes,
)
from rlsys.config.schema import TrainConfig
from rlsys.launch import LaunchError
from rlsys.launch.kuberay import KubeRayLauncher
from rlsys.launch.kuberay_groups import worker_groups
from rlsys.launch.kuberay_render import job_overrides, render, resolve_name
from rlsys.resolve import load_config

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "tests" / "fixtures" / "kuberay_schema.json"
K8S_FILES = ("rayjob.yaml", "raycluster.yaml")  # every committed manifest in k8s/
CRD_KINDS = ("RayJob", "RayCluster")
OBJECT_META = {"name", "namespace", "labels", "annotations"}  # what the renderer may set

# A GPU run with pools of their own, pinned to their groups, on tainted GPU nodes: the values
# as Python (fast to apply to a loaded config) and as the Hydra overrides a user types.
GPU_DISAGGREGATED = {
    "placement.mode": "disaggregated",
    "rollout.engine": "vllm",
    "rollout.num_workers": 2,
    "rollout.num_gpus_per_worker": 1.0,
    "learner.world_size": 4,
    "learner.num_gpus_per_rank": 1.0,
    "learner.num_cpus_per_rank": 4.0,
    "model.dtype": "bfloat16",
    "placement.rollout_resources": {"rollout_slots": 1.0},
    "placement.learner_resources": {"learner_slots": 1.0},
    "launcher.kuberay.learner.gpus": 4,
    "launcher.kuberay.rollout.node_selector": {"pool": "rollout", "gpu": True},
    "launcher.kuberay.rollout.tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {
            "key": "spot",
            "operator": "Equal",
            "value": "yes",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        },
    ],
    "launcher.kuberay.learner.node_selector": {"pool": "learner"},
}
GPU_OVERRIDES = [
    "placement=disaggregated",
    "rollout.engine=vllm",
    "rollout.num_workers=2",
    "rollout.num_gpus_per_worker=1",
    "learner.world_size=4",
    "learner.num_gpus_per_rank=1",
    "learner.num_cpus_per_rank=4",
    "model.dtype=bfloat16",
    "placement.rollout_resources={rollout_slots:1}",
    "placement.learner_resources={learner_slots:1}",
    "launcher.kuberay.learner.gpus=4",
    "launcher.kuberay.rollout.node_selector={pool:rollout,gpu:true}",
    "launcher.kuberay.rollout.tolerations=[{key:nvidia.com/gpu,operator:Exists,"
    "effect:NoSchedule},{key:spot,operator:Equal,value:yes,effect:NoExecute,"
    "tolerationSeconds:300}]",
    "launcher.kuberay.learner.node_selector={pool:learner}",
]

VARIANTS = {
    "rayjob-default": {},
    "raycluster": {"launcher.kuberay.kind": "RayCluster", "launcher.kuberay.image": "rlsys:cpu"},
    "gpu-disaggregated": GPU_DISAGGREGATED,
    "gpu-raycluster": {**GPU_DISAGGREGATED, "launcher.kuberay.kind": "RayCluster"},
    "gpu-shm": {
        **GPU_DISAGGREGATED,
        "launcher.kuberay.head.shm_size": "3Gi",
        "launcher.kuberay.rollout.shm_size": "16Gi",
        "launcher.kuberay.learner.memory": "256Gi",
        "launcher.kuberay.learner.shm_size": "96Gi",
    },
    "critic-reference": {"algorithm.advantage": "gae", "algorithm.kl_coef": 0.01},
    "bare": {
        "launcher.kuberay.volume.claim": None,
        "launcher.kuberay.secret": None,
        "launcher.kuberay.auth_mode": "disabled",
        "launcher.kuberay.service_account": "rlsys-runner",
        "launcher.kuberay.env": {"NCCL_DEBUG": "INFO", "WANDB_MODE": "offline"},
        "launcher.kuberay.head.node_selector": {"pool": "cpu"},
        "launcher.kuberay.head.tolerations": [{"key": "dedicated", "operator": "Exists"}],
        "launcher.kuberay.workers.replicas": 1,
        "launcher.kuberay.workers.memory": "6Gi",
    },
    "existing-claim": {
        "launcher.kuberay.volume.create": False,
        "launcher.kuberay.volume.claim": "team-runs",
        "run.output_dir": "/data/runs",
    },
}


@pytest.fixture(scope="module")
def base() -> TrainConfig:
    """``rlsys submit launcher=kuberay``'s config, composed once (Hydra takes ~0.5 s)."""
    return load_config(["launcher=kuberay"])


# the head container's resource limits in a rendered RayJob
HEAD_LIMITS = [
    *("spec", "rayClusterSpec", "headGroupSpec", "template", "spec", "containers", 0),
    *("resources", "limits"),
]


HEAD_VOLUMES = ["spec", "rayClusterSpec", "headGroupSpec", "template", "spec", "volumes"]


def configured(base: TrainConfig, changes: dict) -> TrainConfig:
    """A copy of ``base`` with dotted keys set: the renderer is a function of the config."""
    cfg = copy.deepcopy(base)
    for key, value in changes.items():
        *parents, last = key.split(".")
        node = cfg
        for part in parents:
            node = getattr(node, part)
        setattr(node, last, copy.deepcopy(value))
    return cfg


# --- validation against the CRDs -------------------------------------------------------------


@pytest.fixture(scope="module")
def crds() -> dict[str, dict]:
    """The v1 openAPIV3Schema of each KubeRay kind, as far as rlsys's manifests reach."""
    return json.loads(SCHEMA.read_text())["kinds"]


def _structural_errors(value, schema: dict, path: str) -> list[str]:
    """What jsonschema does not see in a Kubernetes structural schema: fields it does not
    declare (the API server prunes them silently), int-or-string fields and int32 ranges."""
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            return [f"{path}: {value!r} must be an integer or a string"]
        return []
    if isinstance(value, int) and schema.get("format") == "int32" and abs(value) >= 2**31:
        return [f"{path}: {value} overflows int32"]
    errors: list[str] = []
    if isinstance(value, dict) and schema.get("type") == "object":
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in props:
                errors += _structural_errors(item, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                errors += _structural_errors(item, extra, f"{path}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get(
                "x-rlsys-unchecked"
            ):
                errors.append(f"{path}.{key}: unknown field (the API server would drop it)")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += _structural_errors(item, schema["items"], f"{path}[{i}]")
    return errors


def crd_errors(doc: dict, crds: dict[str, dict]) -> list[str]:
    """Every way ``doc`` breaks its kind's CRD schema (empty: valid)."""
    schema = crds[doc["kind"]]
    errors = [
        f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in jsonschema.Draft4Validator(schema).iter_errors(doc)
    ]
    # metadata is ObjectMeta, which the CRD leaves to the API server: check the fields we set
    errors += [
        f"metadata.{k}: unknown field" for k in doc.get("metadata", {}) if k not in OBJECT_META
    ]
    body = {k: v for k, v in doc.items() if k != "metadata"}
    return errors + _structural_errors(body, schema, "")


def rendered(cfg: TrainConfig, name: str = "test-run") -> list[dict]:
    return render(cfg, ["launcher=kuberay"], name)


def _main_doc(docs: list[dict]) -> dict:
    (doc,) = [d for d in docs if d["kind"] in CRD_KINDS]
    return doc


def _cluster(doc: dict) -> dict:
    return doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]


def _groups(doc: dict) -> dict[str, dict]:
    return {g["groupName"]: g for g in _cluster(doc)["workerGroupSpecs"]}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_variant_validates_against_the_crds(variant, base, crds):
    docs = rendered(configured(base, VARIANTS[variant]))
    kinds = [d["kind"] for d in docs]
    assert kinds[-1] in CRD_KINDS and set(kinds[:-1]) <= {"PersistentVolumeClaim"}
    assert crd_errors(docs[-1], crds) == [], variant


def test_hydra_overrides_give_the_same_manifests(base):
    """The overrides a user types (dicts, lists of dicts, booleans) parse to the values the
    other tests set directly."""
    typed = load_config(["launcher=kuberay", *GPU_OVERRIDES])
    assert rendered(typed) == rendered(configured(base, GPU_DISAGGREGATED))


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        # wrong type
        (["spec", "rayClusterSpec", "workerGroupSpecs", 0, "replicas"], "2", "is not of type"),
        # misspelled fields: jsonschema alone lets them through
        (["spec", "rayClusterSpec", "headGroupSpec", "rayStartParam"], {}, "unknown field"),
        (
            ["spec", "rayClusterSpec", "workerGroupSpecs", 0, "template", "spec", "nodeSelectors"],
            {"a": "b"},
            "unknown field",
        ),
        (["metadata", "nmae"], "x", "unknown field"),
        # a quantity is an integer or a string, and a string must parse as one
        (
            [*HEAD_LIMITS, "cpu"],
            0.5,
            "must be an integer or a string",
        ),
        (
            [*HEAD_LIMITS, "memory"],
            "8 GB",
            "does not match",
        ),
        (["spec", "ttlSecondsAfterFinished"], 2**40, "overflows int32"),
        # the memory-backed /dev/shm: the head's second volume, after the claim
        ([*HEAD_VOLUMES, 1, "emptyDir", "sizeLimit"], "16 GB", "does not match"),
        ([*HEAD_VOLUMES, 1, "emptyDir", "medum"], "Memory", "unknown field"),
    ],
)
def test_validation_rejects_broken_manifests(path, value, expected, base, crds):
    doc = copy.deepcopy(_main_doc(rendered(base)))
    assert crd_errors(doc, crds) == []
    node = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    errors = crd_errors(doc, crds)
    assert any(expected in e for e in errors), errors


def test_validation_rejects_a_missing_required_field(base, crds):
    doc = copy.deepcopy(_main_doc(rendered(base)))
    del _cluster(doc)["workerGroupSpecs"][0]["groupName"]
    assert any("'groupName' is a required property" in e for e in crd_errors(doc, crds))


def test_structural_check_honours_preserve_unknown_fields():
    free = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    closed = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert _structural_errors({"anything": {"b": 1}}, free, "") == []
    assert _structural_errors({"a": "x", "b": 1}, closed, "") == [
        ".b: unknown field (the API server would drop it)"
    ]


# --- worker groups follow the pools ----------------------------------------------------------


def _ray_start_resources(value: str) -> dict:
    """What ``ray start`` receives for rayStartParams.resources: KubeRay pastes
    ``--resources=<value>`` into the pod's bash command line."""
    out = subprocess.run(
        ["bash", "-c", f"printf '%s' --resources={value}"], capture_output=True, text=True
    )
    return json.loads(out.stdout.removeprefix("--resources="))


def test_disaggregated_pools_get_their_own_pinned_groups(base):
    groups = _groups(_main_doc(rendered(configured(base, GPU_DISAGGREGATED))))
    assert list(groups) == ["rollout", "learner"]
    rollout, learner = groups["rollout"], groups["learner"]
    # 2 rollout workers of 1 GPU, one per pod; 4 learner ranks of 1 GPU in one 4-GPU pod
    assert (rollout["replicas"], rollout["minReplicas"], rollout["maxReplicas"]) == (2, 2, 2)
    assert rollout["rayStartParams"]["num-gpus"] == "1"
    assert learner["replicas"] == 1
    assert learner["rayStartParams"] == {
        "num-cpus": "16",
        "num-gpus": "4",
        "resources": '"{\\"learner_slots\\": 4}"',
    }
    assert _ray_start_resources(rollout["rayStartParams"]["resources"]) == {"rollout_slots": 1}
    assert _ray_start_resources(learner["rayStartParams"]["resources"]) == {"learner_slots": 4}
    pod = learner["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {
        "cpu": "16",
        "memory": "192Gi",  # 4Gi per CPU + 16Gi per GPU, plus half that for /dev/shm
        "nvidia.com/gpu": "4",
    }
    assert pod["nodeSelector"] == {"pool": "learner"}
    rollout_pod = rollout["template"]["spec"]
    assert rollout_pod["nodeSelector"] == {"pool": "rollout", "gpu": "true"}
    assert rollout_pod["tolerations"][1] == {
        "key": "spot",
        "operator": "Equal",
        "value": "yes",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    }


def test_learner_group_also_hosts_critic_and_reference(base):
    cfg = configured(
        base,
        {
            "placement.mode": "disaggregated",
            "algorithm.advantage": "gae",
            "algorithm.kl_coef": 0.01,
            "critic.world_size": 2,
            "placement.learner_resources": {"learner_slots": 1.0},
        },
    )
    rollout, learner = worker_groups(cfg)
    # one actor of each pool per pod: 2 pods (learner and critic have 2 ranks each)
    assert learner.replicas == 2
    assert learner.slots == {"learner": 1, "critic": 1, "reference": 1}
    assert learner.custom == {"learner_slots": 3.0}
    assert learner.cpus == 3  # a learner rank, a critic rank and the reference, 1 CPU each
    assert rollout.slots == {"rollout": 1} and rollout.custom == {}


def test_colocated_pools_share_one_group_at_their_colocated_share(base):
    cfg = configured(
        base,
        {
            "learner.num_gpus_per_rank": 1.0,
            "rollout.num_gpus_per_worker": 1.0,
            "launcher.kuberay.workers.gpus": 2,
        },
    )
    (group,) = worker_groups(cfg)
    # colocated: each of 2 pools asks for half its GPUs; 2 ranks + 1 worker fit one 2-GPU pod
    assert group.name == "workers"
    assert (group.replicas, group.gpus, group.slots) == (1, 2, {"rollout": 1, "learner": 2})


def test_a_colocated_group_holds_each_pool_alone_at_full_size(base):
    # 4 ranks x 4 CPUs take turns with 1 worker x 0.5 CPU: the group must hold all 16 CPUs,
    # though the actors' colocated shares (2 + 0.25 per pod) ask for less
    sizes = {
        "learner.world_size": 4,
        "learner.num_cpus_per_rank": 4.0,
        "rollout.num_cpus_per_worker": 0.5,
    }
    (group,) = worker_groups(configured(base, sizes))
    assert group.replicas * group.cpus == 16
    with pytest.raises(ConfigError, match=r"launcher\.kuberay\.workers\.replicas=2 pods"):
        worker_groups(
            configured(
                base,
                {
                    **sizes,
                    "launcher.kuberay.workers.replicas": 2,
                    "launcher.kuberay.workers.cpus": 6,
                },
            )
        )


def test_user_sizes_that_cannot_fit_name_the_keys(base):
    small = configured(base, {**GPU_DISAGGREGATED, "launcher.kuberay.learner.gpus": 0})
    with pytest.raises(ConfigError, match=r"launcher\.kuberay\.learner\.gpus=0"):
        worker_groups(small)
    few = configured(
        base,
        {
            **GPU_DISAGGREGATED,
            "launcher.kuberay.rollout.replicas": 1,
            "launcher.kuberay.rollout.gpus": 1,
        },
    )
    with pytest.raises(ConfigError, match=r"launcher\.kuberay\.rollout\.replicas=1 pods"):
        worker_groups(few)


def test_tensor_parallel_engines_get_pods_with_all_their_gpus(base):
    """An engine over k GPUs holds k whole GPUs on one node (rlsys.placement.gpu_slots): its
    pods are sized by the GPUs per engine, not by the share of one GPU it asks Ray for, and
    pods too small for one engine are refused naming the sizes."""
    tp4 = {
        **GPU_DISAGGREGATED,
        "rollout.num_gpus_per_worker": 4.0,
        "rollout.vllm.tensor_parallel_size": 4,
    }
    groups = {g.name: g for g in worker_groups(configured(base, tp4))}
    assert (groups["rollout"].replicas, groups["rollout"].gpus) == (2, 4)
    narrow = {**tp4, "launcher.kuberay.rollout.replicas": 4, "launcher.kuberay.rollout.gpus": 2}
    with pytest.raises(ConfigError, match=r"rollout\.num_workers=2 x \(.* 4 GPUs\)"):
        worker_groups(configured(base, narrow))


def test_group_settings_the_placement_mode_ignores_are_an_error(base):
    cfg = configured(base, {"launcher.kuberay.rollout.gpus": 1})
    with pytest.raises(ConfigError, match=r"launcher\.kuberay\.rollout is set but placement"):
        worker_groups(cfg)


# --- names, the job's command, the volume ----------------------------------------------------


def test_names_come_from_the_config(base):
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert resolve_name(base, now) == "rlsys-20260102-030405"
    assert resolve_name(configured(base, {"run.name": "My_Run.v2"})) == "my-run-v2"
    assert resolve_name(configured(base, {"run.name": "2026-sweep"})) == "rlsys-2026-sweep"
    named = configured(base, {"run.name": "x", "launcher.kuberay.name": "mine"})
    assert resolve_name(named) == "mine"


def test_the_job_runs_rlsys_train_with_the_run_on_the_volume(base):
    cfg = configured(base, {"launcher.kuberay.namespace": "rl", "run.output_dir": "runs"})
    overrides = [
        "launcher=kuberay",
        "launcher.kuberay.namespace=rl",
        "run.output_dir=runs",
        "trainer.total_steps=5",
    ]
    doc = _main_doc(render(cfg, overrides, "rlsys-x"))
    argv = shlex.split(doc["spec"]["entrypoint"])
    assert argv == [
        "python",
        "-m",
        "rlsys.cli",
        "train",
        "trainer.total_steps=5",
        "run.output_dir=/mnt/rlsys/runs",
        "run.name=rlsys-x",
        "cluster.address=auto",
    ]
    assert doc["metadata"]["namespace"] == "rl"
    # an absolute output_dir and a named run pass through untouched
    cfg = configured(base, {"run.output_dir": "/data", "run.name": "a"})
    assert job_overrides(cfg, ["run.output_dir=/data", "run.name=a"], "a") == [
        "run.output_dir=/data",
        "run.name=a",
    ]
    # retries continue the run the failed attempt left (a fresh run would be refused it)
    retried = configured(
        base, {"run.name": "a", "run.output_dir": "/data", "launcher.kuberay.backoff_limit": 2}
    )
    assert job_overrides(retried, ["run.name=a"], "a") == ["run.name=a", "resume=auto"]


def test_every_pod_mounts_the_volume_and_gets_the_tracker_keys(base):
    claim, job = rendered(configured(base, {"launcher.kuberay.volume.storage_class": "nfs"}))
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "100Gi"}},
        "storageClassName": "nfs",
    }
    cluster = _cluster(job)
    pods = [cluster["headGroupSpec"]["template"]] + [
        g["template"] for g in cluster["workerGroupSpecs"]
    ]
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "rlsys-runs"
        assert container["volumeMounts"][0]["mountPath"] == "/mnt/rlsys"
        env = {e["name"]: e for e in container["env"]}
        assert env["RLSYS_CACHE_DIR"]["value"] == "/mnt/rlsys/cache"
        assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] == {
            "name": "rlsys-tracking",
            "key": "WANDB_API_KEY",
            "optional": True,
        }
    head = cluster["headGroupSpec"]
    assert head["serviceType"] == "ClusterIP" and head["enableIngress"] is False
    assert head["rayStartParams"]["num-cpus"] == "0"


def _pods(doc: dict) -> dict[str, dict]:
    """Each pod template of a RayJob / RayCluster by group name (the head's: "head")."""
    cluster = _cluster(doc)
    pods = {"head": cluster["headGroupSpec"]["template"]}
    return pods | {g["groupName"]: g["template"] for g in cluster["workerGroupSpecs"]}


def _shm_and_memory(pod: dict) -> tuple[str, str]:
    """The sizeLimit of the pod's one memory-backed /dev/shm, and the container's memory."""
    (container,) = pod["spec"]["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["emptyDir"]["medium"] == "Memory"
    memory = container["resources"]["limits"]["memory"]
    assert container["resources"]["requests"]["memory"] == memory
    return volume["emptyDir"]["sizeLimit"], memory


def test_every_pod_gets_a_memory_backed_dev_shm_of_the_configured_size(base, crds):
    docs = rendered(configured(base, VARIANTS["gpu-shm"]))
    pods = _pods(_main_doc(docs))
    assert {name: _shm_and_memory(pod) for name, pod in pods.items()} == {
        "head": ("3Gi", "8Gi"),
        # memory null: the processes' 4Gi per CPU + 16Gi per GPU (2 CPUs, 1 GPU), plus /dev/shm
        "rollout": ("16Gi", "40Gi"),
        "learner": ("96Gi", "256Gi"),  # both set: kept
    }
    # the volume of the run directories is still the first mount
    for pod in pods.values():
        assert pod["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] == "/mnt/rlsys"
    assert crd_errors(_main_doc(docs), crds) == []


def test_dev_shm_defaults_to_a_third_of_the_pod_memory(base):
    """Ray's object store takes 30% of a pod's memory and stays in /dev/shm only if it fits;
    /dev/shm is charged to the pod's memory, so a null memory grows by it."""
    gpu = configured(base, GPU_DISAGGREGATED)
    sizes = {name: _shm_and_memory(pod) for name, pod in _pods(_main_doc(rendered(gpu))).items()}
    assert sizes == {
        "head": ("2731Mi", "8Gi"),  # 8Gi / 3, rounded up to a Mi
        "rollout": ("12Gi", "36Gi"),  # processes 24Gi, /dev/shm half that
        "learner": ("64Gi", "192Gi"),  # processes 128Gi
    }
    pinned = configured(base, {"launcher.kuberay.workers.memory": "64Gi"})
    (group,) = worker_groups(pinned)
    assert (group.memory, group.shm) == ("64Gi", "21846Mi")


@pytest.mark.parametrize(
    ("make", "key"),
    [
        (lambda: KubeRayConfig(kind="Job"), "launcher.kuberay.kind"),
        (lambda: KubeRayConfig(name="Bad_Name"), "launcher.kuberay.name"),
        (lambda: KubeRayConfig(name="a" * 48), "launcher.kuberay.name"),
        (lambda: KubeRayConfig(namespace="Team A"), "launcher.kuberay.namespace"),
        (lambda: KubeRayConfig(image_pull_policy="always"), "launcher.kuberay.image_pull_policy"),
        (lambda: KubeRayConfig(auth_mode="none"), "launcher.kuberay.auth_mode"),
        (lambda: KubeRayConfig(head=HeadConfig(cpus=0)), "launcher.kuberay.head.cpus"),
        (
            lambda: KubeRayConfig(rollout=WorkerGroupConfig(memory="8GB")),
            "launcher.kuberay.rollout.memory",
        ),
        (
            lambda: KubeRayConfig(workers=WorkerGroupConfig(replicas=0)),
            "launcher.kuberay.workers.replicas",
        ),
        (
            lambda: KubeRayConfig(learner=WorkerGroupConfig(tolerations=[{"effekt": "x"}])),
            "launcher.kuberay.learner.tolerations",
        ),
        (
            lambda: KubeRayConfig(head=HeadConfig(memory="8Gi", shm_size="9Gi")),
            "launcher.kuberay.head.shm_size",
        ),
        (
            lambda: KubeRayConfig(learner=WorkerGroupConfig(memory="64Gi", shm_size="70G")),
            "launcher.kuberay.learner.shm_size",
        ),
        (
            lambda: KubeRayConfig(rollout=WorkerGroupConfig(shm_size="16 GB")),
            "launcher.kuberay.rollout.shm_size",
        ),
        (
            lambda: KubeRayConfig(workers=WorkerGroupConfig(shm_size="0")),
            "launcher.kuberay.workers.shm_size",
        ),
        (
            lambda: KubeRayConfig(volume=VolumeConfig(mount_path="mnt")),
            "launcher.kuberay.volume.mount_path",
        ),
        (
            lambda: KubeRayConfig(volume=VolumeConfig(access_mode="RWX")),
            "launcher.kuberay.volume.access_mode",
        ),
    ],
)
def test_bad_kuberay_config_names_the_key(make, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        make()


# --- the command line and kubectl ------------------------------------------------------------


def test_dry_run_prints_the_manifests(capsys, crds):
    assert (
        main(
            [
                "submit",
                "--dry-run",
                "launcher=kuberay",
                "run.name=dry",
                "launcher.kuberay.kind=RayCluster",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("# Rendered by: rlsys submit --dry-run launcher=kuberay run.name=dry")
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "RayCluster"]
    assert docs[1]["metadata"]["name"] == "dry"
    assert crd_errors(docs[1], crds) == []


def test_cli_reports_bad_settings_with_their_key(capsys):
    code = main(
        [
            "submit",
            "--dry-run",
            "launcher=kuberay",
            "launcher.kuberay.workers.cpus=1",
            "launcher.kuberay.head.memory=lots",
        ]
    )
    assert code == 2
    assert "launcher.kuberay.head.memory='lots'" in capsys.readouterr().err


@pytest.fixture
def fake_kubectl(tmp_path, monkeypatch) -> Path:
    """A kubectl on PATH that records its arguments and stdin, and answers like kubectl."""
    log = tmp_path / "kubectl.log"
    script = tmp_path / "bin" / "kubectl"
    script.parent.mkdir()
    script.write_text(
        "#!/bin/sh\n"
        f'echo "ARGS $*" >> {log}\n'
        f'if [ "$2" = "-f" ]; then cat >> {log}; fi\n'
        'echo "kubectl-said $1"\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return log


def test_submit_status_stop_drive_kubectl(fake_kubectl, base, capsys):
    launcher = ["launcher=kuberay", "launcher.kuberay.namespace=rl"]
    assert main(["submit", *launcher, "run.name=live"]) == 0
    out = capsys.readouterr().out
    assert "kubectl-said apply" in out and "rayjob: live" in out
    assert "rlsys status live launcher=kuberay launcher.kuberay.namespace=rl" in out
    log = fake_kubectl.read_text()
    assert log.startswith("ARGS apply -f -\n# Rendered by:")
    applied = list(yaml.safe_load_all(log.split("\n", 1)[1]))
    assert [d["kind"] for d in applied] == ["PersistentVolumeClaim", "RayJob"]

    cfg = configured(base, {"launcher.kuberay.namespace": "rl"})
    assert KubeRayLauncher().status(cfg, "live") == 0
    assert KubeRayLauncher().stop(cfg, "live") == 0
    assert KubeRayLauncher().status(cfg, "raycluster/other") == 0
    calls = [line for line in fake_kubectl.read_text().splitlines() if line.startswith("ARGS")]
    assert calls[1:] == [
        "ARGS get rayjob/live --namespace rl",
        "ARGS delete rayjob/live --namespace rl --wait=false",
        "ARGS get raycluster/other --namespace rl",
    ]
    assert "kubectl-said get" in capsys.readouterr().out


def test_submit_without_kubectl_says_so(tmp_path, monkeypatch, base):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LaunchError, match="`kubectl` is not on PATH"):
        KubeRayLauncher().submit(base, ["launcher=kuberay"], dry_run=False)


def test_groups_that_cannot_fit_fail_the_submit(base):
    cfg = configured(base, {"launcher.kuberay.workers.cpus": 1})
    with pytest.raises(ConfigError, match=r"launcher\.kuberay\.workers\.cpus=1"):
        KubeRayLauncher().submit(cfg, ["launcher=kuberay"], dry_run=True)


# --- the committed manifests -----------------------------------------------------------------


@pytest.mark.parametrize("name", K8S_FILES)
def test_committed_manifests_are_current_and_valid(name, capsys, crds):
    path = REPO / "k8s" / name
    text = path.read_text()
    first = text.splitlines()[0]
    assert first.startswith("# Rendered by: rlsys "), f"{path} lost its header"
    argv = shlex.split(first.removeprefix("# Rendered by: rlsys "))
    assert main(argv) == 0
    assert capsys.readouterr().out == text, (
        f"{path} is stale; regenerate it with: {first.removeprefix('# Rendered by: ')} > k8s/{name}"
    )
    for doc in yaml.safe_load_all(text):
        if doc["kind"] in CRD_KINDS:
            assert crd_errors(doc, crds) == []
            # NCCL, vLLM and Ray's object store need more than Kubernetes' 64Mi /dev/shm
            for group, pod in _pods(doc).items():
                shm, memory = _shm_and_memory(pod)
                assert quantity_bytes(shm) * 3 >= quantity_bytes(memory), (name, group)


def test_k8s_holds_only_the_checked_manifests():
    assert sorted(p.name for p in (REPO / "k8s").glob("*.yaml")) == sorted(K8S_FILES)
