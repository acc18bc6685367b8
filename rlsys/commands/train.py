"""The commands behind the CLI: train, sft, rm, dpo and eval, wired from one validated config."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import threading
import time
from pathlib import Path

from rlsys.config.errors import ConfigError
from rlsys.config.loader import to_yaml
from rlsys.config.schema import TrainConfig
from rlsys.data.tasks import TaskSplits, load_task, screen
from rlsys.launch.local import connect_ray, preflight
from rlsys.models.loading import (
    check_model_path,
    context_length,
    load_tokenizer,
    resolve_model_path,
)
from rlsys.placement.resources import Roles
from rlsys.run.cache import atomic_dir, cache_dir, fingerprint
from rlsys.run.directory import check_output_dir, make_run_dir, record_cluster, write_summary
from rlsys.run.lock import lock_run_dir, owns_run_dir
from rlsys.run.tracking import Tracker
from rlsys.trainers.collector import RolloutCollector, check_group_by
from rlsys.trainers.preference.pairs import preference_pairs

log = logging.getLogger("rlsys")


def _collector(cfg: TrainConfig, pools, tokenizer) -> RolloutCollector:
    return RolloutCollector.for_task(pools.generate, tokenizer, cfg.task, cfg.reward)


def _sft_to(
    cfg: TrainConfig,
    model_path: str,
    out: Path,
    tokenizer,
    task: TaskSplits,
    tracker: Tracker | None,
) -> dict:
    """Run SFT from ``model_path`` on fresh pools and save the result to ``out``."""
    from rlsys.trainers.sft import run_sft
    from rlsys.workers.pools import start_pools

    pools = start_pools(cfg, model_path, Roles(), temperature=1.0)
    try:
        result = run_sft(
            cfg.sft,
            pools,
            _collector(cfg, pools, tokenizer),
            task,
            tokenizer,
            cfg.run.seed,
            tracker,
        )
        pools.learner.save_hf(str(out))
    finally:
        pools.shutdown()
    return dataclasses.asdict(result)


def _warm_start_cache_dir(cfg: TrainConfig, base_path: str) -> Path:
    """Where the warm start with these inputs is cached (everything SFT's result depends on)."""
    key = fingerprint(
        {
            "base": base_path,
            "model": dataclasses.asdict(cfg.model),
            "task": dataclasses.asdict(cfg.task),
            "sft": dataclasses.asdict(cfg.sft),
            "optim": {  # what SFT uses of the learner's optimizer (its lr is sft.lr)
                k: v
                for k, v in dataclasses.asdict(cfg.learner.optim).items()
                if k in ("warmup_steps", "betas", "weight_decay", "grad_clip")
            },
            "seed": cfg.run.seed,
        }
    )
    return cache_dir() / "warm_start" / key


def warm_start(
    cfg: TrainConfig, base_path: str, tokenizer, task: TaskSplits, run_dir: Path
) -> tuple[str, dict]:
    """The warm-started model directory: SFT once, cached by its inputs; with
    ``warm_start.cache=false`` a fresh SFT whose model stays in the run directory."""
    if not cfg.warm_start.cache:
        target = run_dir / "checkpoints" / "warm_start"
    else:
        target = _warm_start_cache_dir(cfg, base_path)
        if (target / "config.json").exists():
            log.info("warm start: using cached %s", target)
            return str(target), {"cached": True, "path": str(target)}
    log.info(
        "warm start: SFT until held-out greedy accuracy >= %s (at most %d steps)",
        cfg.sft.target_accuracy,
        cfg.sft.max_steps,
    )
    with atomic_dir(target) as tmp:  # a crash mid-SFT leaves no half-written cache entry
        info = _sft_to(cfg, base_path, tmp, tokenizer, task, None)
    log.info(
        "warm start: %d SFT steps, accuracy %.3f, %.1fs",
        info["steps"],
        info["eval_accuracy"],
        info["wall_s"],
    )
    return str(target), {"cached": False, "path": str(target), **info}


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


def _inputs(cfg: TrainConfig, rl: bool = True):
    """The model directory, its tokenizer and the task's splits without prompts too long to
    use: every input checked (the model path, the dataset files and, for RL (``rl``), the
    batch size against the training split) before a run directory or Ray exists."""
    check_output_dir(cfg)
    check_model_path(cfg.model.path)
    task = load_task(cfg.task, cfg.run.seed)  # dataset errors first: they need no model
    if rl:
        _check_batch(cfg, task)  # before screening too: the tokenizer takes seconds to load
    base = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(base)
    limit = resolve_prompt_limit(cfg, base, task)
    collector = RolloutCollector.for_task(None, tokenizer, cfg.task, cfg.reward)
    task = task.screen_prompts(collector.prompt_length, limit)
    info = task.summary()
    log.info(
        "dataset: %d train / %d eval prompts; skipped %d malformed rows and %d prompts over "
        "task.max_prompt_tokens=%d",
        info["train_prompts"],
        info["eval_prompts"],
        info["skipped_malformed_rows"],
        info["skipped_too_long"],
        limit,
    )
    if rl:
        _check_batch(cfg, task)
    return base, tokenizer, task


def resolve_prompt_limit(cfg: TrainConfig, model_path: str, task: TaskSplits) -> int:
    """``task.max_prompt_tokens``, set where it is null (once, before anything reads it) to
    the context of the model at ``model_path`` (at most ``rollout.vllm.max_model_len`` with
    vLLM) less the longest response the run may generate. ConfigError when that leaves no
    room, or the model's config states no context."""
    if cfg.task.max_prompt_tokens is not None:
        return cfg.task.max_prompt_tokens
    context = context_length(model_path)
    if cfg.rollout.engine == "vllm" and cfg.rollout.vllm.max_model_len:
        context = min(context or cfg.rollout.vllm.max_model_len, cfg.rollout.vllm.max_model_len)
    response = max(task.max_new_tokens, cfg.eval.max_new_tokens or 0)
    if cfg.task.env.name is not None:  # a prompt is followed by a whole trajectory
        response = cfg.task.env.total_tokens(response)
    if context is None or context <= response:
        why = (
            f"its context ({context} positions) leaves no room after {response} response tokens"
            if context
            else "its config.json states no max_position_embeddings"
        )
        raise ConfigError(
            f"task.max_prompt_tokens=null takes the prompt bound from model {model_path}, but "
            f"{why}; set task.max_prompt_tokens, or lower task.max_new_tokens"
        )
    cfg.task.max_prompt_tokens = context - response
    log.info(
        "task.max_prompt_tokens=null: %d (the model's %d positions less %d response tokens)",
        context - response,
        context,
        response,
    )
    return context - response


def _check_batch(cfg: TrainConfig, task: TaskSplits) -> None:
    if cfg.data.batch_size > len(task.train):
        raise ConfigError(
            f"data.batch_size={cfg.data.batch_size} exceeds the {len(task.train)} usable "
            "training prompts of the task; lower data.batch_size or use a larger dataset"
        )


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
    preflight(cfg, roles)
    resume = _resume_point(cfg)
    base, tokenizer, task = _inputs(cfg)
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
    record_cluster(run_dir, connect_ray(cfg, roles))  # what `rlsys scale` sizes are bounded by
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
        _plain(cfg),
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


@owns_run_dir
def sft(cfg: TrainConfig) -> Path:
    """``rlsys sft``: supervised fine-tuning; the model lands in ``checkpoints/final``."""
    started = time.perf_counter()
    preflight(cfg, Roles())
    base, tokenizer, task = _inputs(cfg, rl=False)
    run_dir = make_run_dir(cfg, "sft")
    connect_ray(cfg, Roles())
    tracker = Tracker(run_dir, cfg.tracking, run_dir.name, _plain(cfg), cfg.sft.max_steps, "sft ")
    final = run_dir / "checkpoints" / "final"
    try:
        info = _sft_to(cfg, base, final, tokenizer, task, tracker)
    finally:
        tracker.close()
    return write_summary(
        run_dir,
        {
            **info,
            "run_dir": str(run_dir),
            "final_model": str(final),
            "total_wall_s": time.perf_counter() - started,
        },
    )


def _starting_model(cfg: TrainConfig, tokenizer, task: TaskSplits, run_dir: Path):
    """The model preference training starts from: ``model.path``, warm-started first when
    ``warm_start.enabled`` (the SFT stage, cached as for ``rlsys train``)."""
    base = resolve_model_path(cfg.model)
    if cfg.warm_start.enabled:
        return warm_start(cfg, base, tokenizer, task, run_dir)
    return base, None


def _preference_setup(cfg: TrainConfig, kind: str):
    """What ``rlsys rm`` and ``rlsys dpo`` start from: checks, the run directory, Ray, the
    tokenizer, the screened task and the starting model (warm-started if enabled)."""
    preflight(cfg, Roles())
    _, tokenizer, task = _inputs(cfg, rl=False)
    run_dir = make_run_dir(cfg, kind)
    log.info("run directory: %s", run_dir)
    connect_ray(cfg, Roles())
    start, warm = _starting_model(cfg, tokenizer, task, run_dir)
    return run_dir, tokenizer, task, start, warm


def _preference_summary(run_dir, result, data, start, warm, final, started) -> Path:
    """summary.json of ``rlsys rm`` / ``rlsys dpo``: the result, the pairs, the models."""
    return write_summary(
        run_dir,
        {
            **dataclasses.asdict(result),
            "data": data,
            "initial_model": start,
            "warm_start": warm,
            "run_dir": str(run_dir),
            "final_model": str(final),
            "total_wall_s": time.perf_counter() - started,
        },
    )


@owns_run_dir
def rm(cfg: TrainConfig) -> Path:
    """``rlsys rm``: train a reward model on preference pairs; it lands in
    ``checkpoints/final`` as a sequence-classification model for ``reward.model.paths``."""
    from rlsys.data.preferences import reward_model_rows
    from rlsys.placement.resources import plan_placement
    from rlsys.trainers.preference.rm import run_rm
    from rlsys.workers.learner import LearnerGroup
    from rlsys.workers.rollout import RolloutPool

    started = time.perf_counter()
    run_dir, tokenizer, task, start, warm = _preference_setup(cfg, "rm")
    placement = plan_placement(cfg, Roles())
    rollout = None
    if cfg.preference.samples_policy:
        rollout = RolloutPool(cfg.rollout, placement.rollout, start, cfg.model.dtype)
    try:
        train, evals, data = preference_pairs(
            cfg,
            tokenizer,
            task,
            reward_model_rows(tokenizer, cfg.task.chat_template),
            rollout.generate if rollout is not None else None,
        )
    finally:
        if rollout is not None:
            rollout.shutdown()  # before the reward model's learners take the CPUs
    learner = LearnerGroup(
        cfg.learner,
        placement.learner,
        start,
        cfg.model.dtype,
        1.0,
        role="reward",
        lora=cfg.model.lora,
    )
    tracker = Tracker(run_dir, cfg.tracking, run_dir.name, _plain(cfg), cfg.rm.max_steps, "rm ")
    final = run_dir / "checkpoints" / "final"
    try:
        result = run_rm(cfg.rm, learner, train, evals, cfg.run.seed, tracker)
        learner.save_hf(str(final))
    finally:
        tracker.close()
        learner.shutdown()
        placement.release()
    log.info(
        "reward model: held-out pairwise accuracy %.3f -> %.3f; use it with "
        "reward.model.paths=[%s]",
        result.eval_pairwise_accuracy_before,
        result.eval_pairwise_accuracy,
        final,
    )
    return _preference_summary(run_dir, result, data, start, warm, final, started)


@owns_run_dir
def dpo(cfg: TrainConfig) -> Path:
    """``rlsys dpo``: DPO / IPO / conservative DPO of the policy on preference pairs; the
    policy lands in ``checkpoints/final``."""
    from rlsys.data.preferences import policy_rows
    from rlsys.trainers.preference.dpo import run_dpo
    from rlsys.workers.pools import start_pools

    started = time.perf_counter()
    run_dir, tokenizer, task, start, warm = _preference_setup(cfg, "dpo")
    pools = start_pools(cfg, start, Roles(), temperature=1.0)
    tracker = Tracker(run_dir, cfg.tracking, run_dir.name, _plain(cfg), cfg.dpo.max_steps, "dpo ")
    final = run_dir / "checkpoints" / "final"
    try:
        collector = _collector(cfg, pools, tokenizer)
        train, evals, data = preference_pairs(
            cfg, tokenizer, task, policy_rows(collector), pools.generate
        )
        result = run_dpo(
            cfg.dpo,
            pools,
            collector,
            train,
            evals,
            task.eval[: cfg.eval.num_prompts],
            cfg.eval.max_new_tokens or task.max_new_tokens,
            cfg.run.seed,
            tracker,
        )
        pools.learner.save_hf(str(final))
    finally:
        tracker.close()
        pools.shutdown()
    return _preference_summary(run_dir, result, data, start, warm, final, started)


def evaluate(cfg: TrainConfig) -> dict:
    """``rlsys eval``: greedy held-out accuracy of ``model.path`` in this process (no Ray)."""
    from rlsys.engines import ENGINES
    from rlsys.runtime import limit_threads

    limit_threads(cfg.rollout.num_cpus_per_worker)
    path = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(path)
    task = load_task(cfg.task, cfg.run.seed)
    limit = resolve_prompt_limit(cfg, path, task)
    engine = ENGINES.get(cfg.rollout.engine)(
        path, cfg.rollout.dtype or cfg.model.dtype, cfg.rollout
    )
    collector = RolloutCollector.for_task(
        lambda prompts, sampling, seed, budgets, images=None: engine.generate(
            prompts, sampling, budgets, images
        ),
        tokenizer,
        cfg.task,
        cfg.reward,
    )
    prompts = screen(
        task.eval[: cfg.eval.num_prompts],
        collector.prompt_length,
        limit,
        "eval",
    )
    check_group_by(cfg.eval.group_by, prompts)
    result = collector.evaluate(
        prompts, cfg.eval.max_new_tokens or task.max_new_tokens, cfg.eval.group_by
    )
    return {"model": path, **dataclasses.asdict(result)}


def _plain(cfg: TrainConfig) -> dict:
    import yaml

    return yaml.safe_load(to_yaml(cfg))


def export_policy(checkpoint: str, out_dir: str, merge: bool = False) -> Path:
    """``rlsys export``: the policy of a checkpoint (``checkpoints/step_<N>`` or its
    ``policy/``; a run directory: its latest complete checkpoint) as a Hugging Face
    directory, read straight from the shards; a LoRA run's as a PEFT adapter directory, or
    with ``merge`` as the model with its adapters merged in."""
    from rlsys.backends.export import export_hf
    from rlsys.checkpoint.store import CheckpointError, CheckpointStore, problem

    path = Path(checkpoint).expanduser().resolve()
    if not path.is_dir():
        raise CheckpointError(
            f"{checkpoint} is not a directory; pass a run directory, one of its "
            "checkpoints/step_<N> or a step's policy/"
        )
    if (path / "checkpoints").is_dir() and not (path / "policy").is_dir():
        latest = CheckpointStore(path / "checkpoints", 1).latest()
        if latest is None:
            raise CheckpointError(
                f"run directory {path} has no complete checkpoint to export (see the warnings "
                "above); its checkpoints/final, if there, is already a Hugging Face directory"
            )
        log.info("exporting %s, the latest complete checkpoint of %s", latest.name, path)
        path = latest
    if not any((path / name).exists() for name in ("policy", "backend.json")):
        raise CheckpointError(
            f"{path} is not a run directory, a checkpoint or a policy directory (it has no "
            "checkpoints/, policy/ or backend.json); pass a run directory, one of its "
            "checkpoints/step_<N> or a step's policy/"
        )
    if (path / "policy").is_dir():
        reason = problem(path)
        if reason is not None:
            raise CheckpointError(f"checkpoint {path} is not usable: {reason}")
        path = path / "policy"
    out = Path(out_dir).expanduser().resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(
            f"cannot create the output directory {out_dir} ({exc.strerror}: {exc.filename}); "
            "pass a directory path you can write"
        ) from exc
    try:
        export_hf(str(path), str(out), merge)
    except FileNotFoundError as exc:  # the backend's own errors are CheckpointErrors
        raise CheckpointError(str(exc)) from exc
    return out
