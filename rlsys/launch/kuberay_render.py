"""The KubeRay manifests of a run, rendered from its config: pure functions, no kubectl.

``render`` gives the objects ``rlsys submit launcher=kuberay`` applies: the checkpoint
volume's claim (when it creates one) and a RayJob (the run on a cluster of its own, deleted
after it ends) or a RayCluster (a cluster to send runs to with ``launcher=ray_job``). The
dashboard stays inside the cluster: a ClusterIP head service and no ingress.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import yaml

from rlsys.config.kuberay import MAX_NAME, KubeRayConfig
from rlsys.config.schema import TrainConfig
from rlsys.launch.base import override_key, shell_join, train_command
from rlsys.launch.kuberay_groups import GroupShape, pod_memory, worker_groups

API_VERSION = "ray.io/v1"
LABELS = {"app.kubernetes.io/name": "rlsys"}
VOLUME = "rlsys-runs"  # the pod-level name of the claim's volume
SHM = "shm"  # the pod-level name of the memory-backed /dev/shm
HEAD_PORTS = [  # KubeRay's port names: its head service and the RayJob submitter use them
    {"name": "gcs-server", "containerPort": 6379},
    {"name": "dashboard", "containerPort": 8265},
    {"name": "client", "containerPort": 10001},
]


def resolve_name(cfg: TrainConfig, now: datetime | None = None) -> str:
    """metadata.name: launcher.kuberay.name, else run.name made a valid name, else
    rlsys-<UTC time> (``now``)."""
    kuberay = cfg.launcher.kuberay
    if kuberay.name:
        return kuberay.name
    if cfg.run.name:
        slug = re.sub(r"[^a-z0-9]+", "-", cfg.run.name.lower()).strip("-")
        if not slug[:1].isalpha():
            slug = f"rlsys-{slug}"
        return slug[: MAX_NAME[kuberay.kind]].rstrip("-")
    now = now or datetime.now(UTC)
    return f"rlsys-{now:%Y%m%d-%H%M%S}"


def job_overrides(cfg: TrainConfig, overrides: Sequence[str], name: str) -> list[str]:
    """The overrides the job's ``rlsys train`` gets: a relative run.output_dir moves onto the
    volume, an unnamed run is named like its RayJob (so ``resume=auto`` finds it), and with
    ``backoff_limit`` retries each retry continues the run (``resume=auto``) rather than
    being refused the directory the failed attempt left."""
    args = list(overrides)
    volume = cfg.launcher.kuberay.volume
    if volume.claim is not None and not posixpath.isabs(cfg.run.output_dir):
        args = [o for o in args if override_key(o) != "run.output_dir"]
        args.append(f"run.output_dir={posixpath.join(volume.mount_path, cfg.run.output_dir)}")
    if cfg.run.name is None:
        args.append(f"run.name={name}")
    if cfg.launcher.kuberay.backoff_limit > 0 and cfg.resume is None:
        args.append("resume=auto")
    return args


def _text(value: Any) -> str:
    """A label / env value as Kubernetes wants it: booleans in YAML's spelling."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _toleration(item: dict[str, Any]) -> dict[str, Any]:
    return {k: int(v) if k == "tolerationSeconds" else _text(v) for k, v in item.items()}


def _env(kuberay: KubeRayConfig) -> list[dict[str, Any]]:
    plain = {}
    if kuberay.volume.claim is not None:
        # the built-in model and the warm start are built once, where every pod reads them
        plain["RLSYS_CACHE_DIR"] = posixpath.join(kuberay.volume.mount_path, "cache")
    plain.update({str(k): _text(v) for k, v in kuberay.env.items()})
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in plain.items()]
    if kuberay.secret is not None:
        env += [
            {
                "name": key,
                "valueFrom": {
                    "secretKeyRef": {"name": kuberay.secret, "key": key, "optional": True}
                },
            }
            for key in kuberay.secret_keys
        ]
    return env


def _pod(
    kuberay: KubeRayConfig,
    container: str,
    resources: dict[str, Any],
    shm: str,
    node_selector: dict[str, Any],
    tolerations: list[dict[str, Any]],
    ports: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A pod template running the image as KubeRay's container ``container``, with a
    memory-backed /dev/shm of ``shm`` (KubeRay's operator then adds none of its own)."""
    box: dict[str, Any] = {
        "name": container,
        "image": kuberay.image,
        "imagePullPolicy": kuberay.image_pull_policy,
        "resources": resources,
    }
    if ports:
        box["ports"] = ports
    env = _env(kuberay)
    if env:
        box["env"] = env
    mounts = [{"name": SHM, "mountPath": "/dev/shm"}]
    volumes: list[dict[str, Any]] = [
        {"name": SHM, "emptyDir": {"medium": "Memory", "sizeLimit": shm}}
    ]
    claim = kuberay.volume.claim
    if claim is not None:
        mounts.insert(0, {"name": VOLUME, "mountPath": kuberay.volume.mount_path})
        volumes.insert(0, {"name": VOLUME, "persistentVolumeClaim": {"claimName": claim}})
    box["volumeMounts"] = mounts
    spec: dict[str, Any] = {"containers": [box], "volumes": volumes}
    if kuberay.service_account:
        spec["serviceAccountName"] = kuberay.service_account
    if node_selector:
        spec["nodeSelector"] = {str(k): _text(v) for k, v in node_selector.items()}
    if tolerations:
        spec["tolerations"] = [_toleration(t) for t in tolerations]
    return {"metadata": {"labels": dict(LABELS)}, "spec": spec}


def _sizes(cpus: int, memory: str, gpus: int = 0, gpu_resource: str = "") -> dict[str, Any]:
    # requests = limits: a pod gets exactly what Ray is told it has (Guaranteed QoS)
    amounts = {"cpu": str(cpus), "memory": memory}
    limits = {**amounts, gpu_resource: str(gpus)} if gpus else dict(amounts)
    return {"requests": amounts, "limits": limits}


def _ray_resources(custom: dict[str, float]) -> str:
    """rayStartParams.resources in the form KubeRay documents: a double-quoted JSON string
    with escaped quotes, pasted into the pod's ``ray start`` command line."""
    amounts = {k: int(v) if float(v).is_integer() else v for k, v in sorted(custom.items())}
    return '"' + json.dumps(amounts).replace('"', '\\"') + '"'


def _worker_group(kuberay: KubeRayConfig, group: GroupShape) -> dict[str, Any]:
    # num-gpus is explicit, 0 included: images built on CUDA bases can see a node's GPUs
    # without asking for them, and Ray would otherwise offer those to GPU actors
    params = {"num-cpus": str(group.cpus), "num-gpus": str(group.gpus)}
    if group.custom:
        params["resources"] = _ray_resources(group.custom)
    sizes = _sizes(group.cpus, group.memory, group.gpus, kuberay.gpu_resource)
    return {
        "groupName": group.name,
        "replicas": group.replicas,
        "minReplicas": group.replicas,
        "maxReplicas": group.replicas,
        "rayStartParams": params,
        "template": _pod(
            kuberay,
            "ray-worker",
            sizes,
            group.shm,
            group.config.node_selector,
            group.config.tolerations,
        ),
    }


def cluster_spec(cfg: TrainConfig) -> dict[str, Any]:
    """spec of a RayCluster (a RayJob's rayClusterSpec): head plus sized worker groups."""
    kuberay = cfg.launcher.kuberay
    head = kuberay.head
    memory, shm = pod_memory(head.memory, head.shm_size, 0)
    return {
        "rayVersion": kuberay.ray_version,
        "enableInTreeAutoscaling": False,  # the pools have fixed sizes; no autoscaler
        "authOptions": {"mode": kuberay.auth_mode},
        "headGroupSpec": {
            "serviceType": "ClusterIP",  # the dashboard stays inside the cluster
            "enableIngress": False,
            # num-cpus 0: no actor lands on the head; the driver needs no Ray resources
            "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0", "num-gpus": "0"},
            "template": _pod(
                kuberay,
                "ray-head",
                _sizes(head.cpus, memory),
                shm,
                head.node_selector,
                head.tolerations,
                HEAD_PORTS,
            ),
        },
        "workerGroupSpecs": [_worker_group(kuberay, g) for g in worker_groups(cfg)],
    }


def _claim(kuberay: KubeRayConfig) -> dict[str, Any]:
    volume = kuberay.volume
    spec: dict[str, Any] = {
        "accessModes": [volume.access_mode],
        "resources": {"requests": {"storage": volume.size}},
    }
    if volume.storage_class is not None:
        spec["storageClassName"] = volume.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": volume.claim, "namespace": kuberay.namespace, "labels": dict(LABELS)},
        "spec": spec,
    }


def render(cfg: TrainConfig, overrides: Sequence[str], name: str) -> list[dict[str, Any]]:
    """The objects to apply, in order: the volume's claim (if rlsys creates it), then the
    RayJob running ``rlsys train <overrides>`` or the RayCluster, named ``name``."""
    kuberay = cfg.launcher.kuberay
    meta = {"name": name, "namespace": kuberay.namespace, "labels": dict(LABELS)}
    if kuberay.kind == "RayCluster":
        main = {"apiVersion": API_VERSION, "kind": "RayCluster", "metadata": meta}
        main["spec"] = cluster_spec(cfg)
    else:
        entrypoint = shell_join(train_command(job_overrides(cfg, overrides, name)))
        main = {"apiVersion": API_VERSION, "kind": "RayJob", "metadata": meta}
        main["spec"] = {
            "entrypoint": entrypoint,
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": kuberay.ttl_seconds_after_finished,
            "backoffLimit": kuberay.backoff_limit,
            "rayClusterSpec": cluster_spec(cfg),
        }
    volume = kuberay.volume
    return ([_claim(kuberay)] if volume.claim is not None and volume.create else []) + [main]


def to_yaml(docs: list[dict[str, Any]], command: Sequence[str]) -> str:
    """Multi-document YAML, headed by the command that renders it again."""
    header = (
        f"# Rendered by: {shell_join(command)}\n"
        "# Apply with: kubectl apply -f <this file>   (see k8s/README.md)\n"
    )
    # width: keep long values (the entrypoint) on one line, as a reader greps for them
    return header + yaml.safe_dump_all(docs, sort_keys=False, width=1_000_000)
