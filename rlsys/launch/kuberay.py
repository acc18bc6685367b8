"""``launcher=kuberay``: render the run's KubeRay manifests (kuberay_render) and hand them to
``kubectl`` (docs/launching.md, k8s/README.md).

``stop`` deletes the RayJob / RayCluster rather than suspending it: deletion is what stop
means for the other launchers, it frees the GPUs at once, works for both kinds and leaves the
name free for the next submit. The run directory lives on the volume, so a later submit with
the same run.name and ``resume=auto`` continues from the last checkpoint.
"""

from __future__ import annotations

from rlsys.config.schema import TrainConfig
from rlsys.launch.base import LAUNCHERS, run_tool, shell_join
from rlsys.launch.kuberay_render import render, resolve_name, to_yaml


def _target(cfg: TrainConfig, job_id: str) -> list[str]:
    """``kubectl`` arguments naming the object: ``rayjob NAME`` (or ``kind/NAME`` as given)."""
    kuberay = cfg.launcher.kuberay
    name = job_id if "/" in job_id else f"{kuberay.kind.lower()}/{job_id}"
    return [name, "--namespace", kuberay.namespace]


@LAUNCHERS.register("kuberay")
class KubeRayLauncher:
    """Submits the run as a KubeRay RayJob (or brings up a RayCluster) with ``kubectl``."""

    def submit(self, cfg: TrainConfig, overrides: list[str], dry_run: bool) -> int:
        """Print the manifests (``dry_run``) or ``kubectl apply`` them and print the name."""
        kuberay = cfg.launcher.kuberay
        name = resolve_name(cfg)
        docs = render(cfg, overrides, name)  # a ConfigError names the keys that do not fit
        text = to_yaml(docs, ["rlsys", "submit", "--dry-run", *overrides])
        if dry_run:
            print(text, end="")
            return 0
        proc = run_tool(
            ["kubectl", "apply", "-f", "-"],
            cfg.launcher.command_timeout_s,
            f"applying the {kuberay.kind}",
            stdin=text,
        )
        print(proc.stdout.strip())
        ns = kuberay.namespace
        same = shell_join([o for o in overrides if o.startswith("launcher")])
        print(f"{kuberay.kind.lower()}: {name}")
        print(f"  status: rlsys status {name} {same}")
        print(f"  stop:   rlsys stop {name} {same}")
        if kuberay.kind == "RayJob":
            # the submitter is a Kubernetes Job named like the RayJob; it follows the logs
            print(f"  logs:   kubectl logs -n {ns} -f -l job-name={name}")
        else:
            print(
                f"  runs:   kubectl port-forward -n {ns} svc/{name}-head-svc 8265:8265, then "
                "rlsys submit launcher=ray_job cluster.address=http://127.0.0.1:8265 ..."
            )
        return 0

    def status(self, cfg: TrainConfig, job_id: str) -> int:
        """Print ``kubectl get`` of the RayJob (job and deployment status) or RayCluster."""
        proc = run_tool(
            ["kubectl", "get", *_target(cfg, job_id)],
            cfg.launcher.command_timeout_s,
            f"asking for {job_id}",
        )
        print(proc.stdout.strip())
        return 0

    def stop(self, cfg: TrainConfig, job_id: str) -> int:
        """Delete the RayJob or RayCluster (and with it its pods); the volume stays."""
        proc = run_tool(
            ["kubectl", "delete", *_target(cfg, job_id), "--wait=false"],
            cfg.launcher.command_timeout_s,
            f"deleting {job_id}",
        )
        print(proc.stdout.strip())
        return 0
