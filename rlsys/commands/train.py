"""``rlsys train``: warm start (if enabled), RL, final eval; with ``resume`` it continues a run
from its latest complete checkpoint, and SIGTERM / SIGINT stop it after a checkpoint."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from pathlib import Path

from rlsys.commands.setup import plain_config, program_inputs
from rlsys.commands.sft import warm_start
from rlsys.config.loader import to_yaml
from rlsys.config.schema import TrainConfig
from rlsys.launch import local
from rlsys.placement.resources import Roles
from rlsys.run.directory import make_run_dir, record_cluster, write_summary
from rlsys.run.lock import lock_run_dir, owns_run_dir
from rlsys.run.tracking import Tracker

log = logging.getLogger("rlsys")


@contextlib.contextmanager
def _on_stop_signals(event: threading.Event, stopped_by: list[str]):
    """While the block runs, SIGTERM (Slurm and Kubernetes preemption) and SIGINT (Ctrl-C)
    set ``event``: the controller checkpoints after the current step and stops; the signal's
    name is appended to ``stopped_by``. A second SIGINT interrupts at once."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed on the main thread
        return

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if name == "SIGINT" and name in stopped_by:
            raise KeyboardInterrupt
        log.warning(
            "%s: checkpointing after the current step, then exiting%s",
            name,
            " (Ctrl-C again to stop at once, without a checkpoint)" if name == "SIGINT" else "",
        )
        stopped_by.append(name)
        event.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _resume_point(cfg: TrainConfig) -> tuple[Path, list[Path], dict] | None:
    """The run directory to continue, its checkpoints to try (newest first, the first one
    with a readable controller state leading) and that state's ``run_info``; None for a fresh
    run."""
    from rlsys.checkpoint.store import CheckpointError, CheckpointStore, resolve_resume
    from rlsys.trainers.rl.saved_state import read_run_state

    if not cfg.resume:
        return None
    found = resolve_resume(cfg.resume, cfg.run.output_dir, cfg.run.name)
    if found is None:
        log.info("resume=auto: no checkpoint under %s, starting a fresh run", cfg.run.output_dir)
        return None
    run_dir, chosen = found
    lock_run_dir(run_dir, f"resume={cfg.resume}")  # before its checkpoints are read
    complete = CheckpointStore(run_dir / "checkpoints", cfg.checkpoint.keep).complete()
    if chosen is not None:
        complete = [p for p in complete if p == chosen]
    if not complete:
        raise CheckpointError(
            f"resume={cfg.resume}: {chosen or run_dir / 'checkpoints'} holds no complete "
            "checkpoint (see the warnings above); pass an earlier one or start fresh"
        )
    reasons = []
    for i, path in enumerate(complete):
        try:
            run_info = read_run_state(path, cfg.trainer.total_steps)["run_info"]
        except (CheckpointError, KeyError, TypeError) as exc:
            log.warning("checkpoint %s does not load (%s): trying the previous one", path, exc)
            reasons.append(f"{path.name}: {exc}")
            continue
        return run_dir, complete[i:], run_info
    raise CheckpointError(
        f"resume={cfg.resume}: no checkpoint of {run_dir} loads ({'; '.join(reasons)}); "
        "nothing was changed. Pass resume=<run dir>/checkpoints/step_<N> of a good one, or "
        "move the run directory away to start fresh"
    )


@owns_run_dir
def train(cfg: TrainConfig) -> Path:
    """``rlsys train``: warm start (if enabled), RL, final eval; returns summary.json's path.
    With ``resume`` it continues a run from its latest complete checkpoint."""
    started = time.perf_counter()
    roles = Roles.for_rl(cfg)
    local.preflight(cfg, roles)
    resume = _resume_point(cfg)
    base, tokenizer, task = program_inputs(cfg)
    from rlsys.checkpoint.store import CheckpointStore  # after the checks: torch takes seconds
    from rlsys.trainers.rl.controller import Controller
    from rlsys.workers.pools import start_pools

    saved: dict = {}
    if resume is None:
        run_dir = make_run_dir(cfg, "train", restart=cfg.resume == "auto")
    else:
        run_dir, candidates, saved = resume
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        log.info("resuming %s from %s", run_dir, candidates[0])
    log.info("run directory: %s", run_dir)
    record_cluster(
        run_dir, local.connect_ray(cfg, roles)
    )  # what `rlsys scale` sizes are bounded by
    policy_path, warm = base, None
    if saved.get("model_path") and Path(saved["model_path"]).exists():
        policy_path, warm = saved["model_path"], saved.get("warm_start")
    elif cfg.warm_start.enabled:
        policy_path, warm = warm_start(cfg, base, tokenizer, task, run_dir)
    pools = start_pools(cfg, policy_path, roles)
    tracker = Tracker(
        run_dir,
        cfg.tracking,
        run_dir.name,
        plain_config(cfg),
        cfg.trainer.total_steps,
        run_id=saved.get("tracker_run_id"),
    )
    try:
        controller = Controller(
            cfg,
            pools,
            tokenizer,
            task,
            tracker,
            CheckpointStore(run_dir / "checkpoints", cfg.checkpoint.keep),
            {"model_path": policy_path, "warm_start": warm, "tracker_run_id": tracker.run_id},
            run_dir,
        )
        resumed_from = None
        if resume is not None:
            resumed_from = controller.recovery.restore_newest(candidates)
        stopped_by: list[str] = []
        with _on_stop_signals(controller.preempt, stopped_by):
            # the policy exported to checkpoints/final, unless stopped by SIGTERM
            summary = controller.run(final=run_dir / "checkpoints" / "final")
        summary["stopped_by"] = stopped_by[0] if stopped_by else None
        summary["nodes"] = pools.node_ids()  # the Ray node of every actor, per pool
    finally:
        tracker.close()
        pools.shutdown()
    summary.update(
        run_dir=str(run_dir),
        model_path=policy_path,
        warm_start=warm,
        resumed_from=str(resumed_from) if resumed_from else None,
        dataset=task.summary(),
        total_wall_s=time.perf_counter() - started,
    )
    return write_summary(run_dir, summary)
