"""The commands behind the CLI: train, sft, rm, dpo and eval, wired from one validated config."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import threading
import time
from pathlib import Path

from rlsys.cache import atomic_dir, cache_dir, fingerprint
from rlsys.collector import RolloutCollector
from rlsys.config.loader import to_yaml
from rlsys.config.schema import TrainConfig
from rlsys.data.tasks import TaskSplits, load_task
from rlsys.launch.local import connect_ray, preflight
from rlsys.models.loading import load_tokenizer, resolve_model_path
from rlsys.placement import Roles
from rlsys.run_dir import make_run_dir, write_summary
from rlsys.tracking import Tracker

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
    from rlsys.pools import start_pools
    from rlsys.sft import run_sft

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
def _on_sigterm(event: threading.Event):
    """While the block runs, SIGTERM (Slurm and Kubernetes preemption) sets ``event``: the
    controller checkpoints after the current step and stops."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed on the main thread
        return

    def handler(signum, frame):
        log.warning("SIGTERM: checkpointing after the current step, then exiting")
        event.set()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _screened_task(cfg: TrainConfig, tokenizer) -> TaskSplits:
    """The task's splits without prompts too long to use; logs what was left out."""
    collector = RolloutCollector.for_task(None, tokenizer, cfg.task, cfg.reward)
    task = load_task(cfg.task, cfg.run.seed).screen_prompts(collector.encode)
    info = task.summary()
    log.info(
        "dataset: %d train / %d eval prompts; skipped %d malformed rows and %d prompts over "
        "task.max_prompt_tokens=%d",
        info["train_prompts"],
        info["eval_prompts"],
        info["skipped_malformed_rows"],
        info["skipped_too_long"],
        cfg.task.max_prompt_tokens,
    )
    return task


def _resume_point(cfg: TrainConfig) -> tuple[Path, list[Path]] | None:
    """The run directory to continue and its checkpoints to try, newest first (None: a fresh
    run)."""
    from rlsys.checkpoint import CheckpointError, CheckpointStore, resolve_resume

    if not cfg.resume:
        return None
    found = resolve_resume(cfg.resume, cfg.run.output_dir, cfg.run.name)
    if found is None:
        log.info("resume=auto: no checkpoint under %s, starting a fresh run", cfg.run.output_dir)
        return None
    run_dir, chosen = found
    complete = CheckpointStore(run_dir / "checkpoints", cfg.checkpoint.keep).complete()
    if chosen is not None:
        complete = [p for p in complete if p == chosen]
    if not complete:
        raise CheckpointError(
            f"resume={cfg.resume}: {chosen or run_dir / 'checkpoints'} holds no complete "
            "checkpoint (see the warnings above); pass an earlier one or start fresh"
        )
    return run_dir, complete


def train(cfg: TrainConfig) -> Path:
    """``rlsys train``: warm start (if enabled), RL, final eval; returns summary.json's path.
    With ``resume`` it continues a run from its latest complete checkpoint."""
    from rlsys.checkpoint import CheckpointStore, read_trainer_state
    from rlsys.controller import Controller, save_final_policy
    from rlsys.pools import start_pools

    started = time.perf_counter()
    roles = Roles.for_rl(cfg)
    preflight(cfg, roles)
    resume = _resume_point(cfg)
    saved: dict = {}
    if resume is None:
        run_dir = make_run_dir(cfg, "train")
    else:
        run_dir, candidates = resume
        saved = read_trainer_state(candidates[0])["run_info"]
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
        log.info("resuming %s from %s", run_dir, candidates[0])
    log.info("run directory: %s", run_dir)
    connect_ray(cfg, roles)
    base = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(base)
    task = _screened_task(cfg, tokenizer)
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
    final = None
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
            resumed_from = controller.restore_newest(candidates)
        with _on_sigterm(controller.preempt):
            summary = controller.run()
        summary["nodes"] = pools.node_ids()  # the Ray node of every actor, per pool
        if not summary["preempted"]:
            final = save_final_policy(pools, run_dir)
    finally:
        tracker.close()
        pools.shutdown()
    summary.update(
        run_dir=str(run_dir),
        model_path=policy_path,
        final_model=str(final) if final else None,
        warm_start=warm,
        resumed_from=str(resumed_from) if resumed_from else None,
        dataset=task.summary(),
        total_wall_s=time.perf_counter() - started,
    )
    return write_summary(run_dir, summary)


def sft(cfg: TrainConfig) -> Path:
    """``rlsys sft``: supervised fine-tuning; the model lands in ``checkpoints/final``."""
    started = time.perf_counter()
    preflight(cfg, Roles())
    run_dir = make_run_dir(cfg, "sft")
    connect_ray(cfg, Roles())
    base = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(base)
    task = load_task(cfg.task, cfg.run.seed)
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
    run_dir = make_run_dir(cfg, kind)
    log.info("run directory: %s", run_dir)
    connect_ray(cfg, Roles())
    tokenizer = load_tokenizer(resolve_model_path(cfg.model))
    task = _screened_task(cfg, tokenizer)
    start, warm = _starting_model(cfg, tokenizer, task, run_dir)
    return run_dir, tokenizer, task, start, warm


def _load_pairs(cfg: TrainConfig, task: TaskSplits, generate, tokenizer):
    """``preference.*``'s pairs; synthetic pairs made of the starting model's replies
    (``preference.synthetic``: mistakes, ranked) sample them through ``generate`` (its
    rollout pool)."""
    from rlsys.data.preferences import load_pairs, sample_replies
    from rlsys.types import SamplingParams

    pref = cfg.preference
    if not pref.samples_policy:
        return load_pairs(pref, task, cfg.run.seed)
    sampling = SamplingParams(
        n=pref.samples_per_prompt,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        max_new_tokens=task.max_new_tokens,
    )
    collector = RolloutCollector.for_task(generate, tokenizer, cfg.task, cfg.reward)
    log.info(
        "preference pairs (%s): sampling %d replies per prompt from the starting model",
        pref.synthetic,
        pref.samples_per_prompt,
    )
    return load_pairs(pref, task, cfg.run.seed, sample_replies(collector, sampling, cfg.run.seed))


def _pairs(cfg: TrainConfig, tokenizer, task: TaskSplits, encode, generate=None):
    """Training and held-out pairs of ``preference.*``, packed with ``encode``."""
    from rlsys.data.preferences import pack_pairs

    splits = _load_pairs(cfg, task, generate, tokenizer)
    pad, limit = tokenizer.pad_token_id, cfg.preference.max_length
    train = pack_pairs(splits.train, encode, pad, limit)
    evals = pack_pairs(splits.eval, encode, pad, limit)
    info = {
        **splits.summary(),
        "train_pairs": len(train.kept),
        "eval_pairs": len(evals.kept),
        "skipped_too_long": train.skipped_too_long + evals.skipped_too_long,
    }
    log.info(
        "preference pairs (%s): %d train / %d held out; skipped %d malformed rows and %d "
        "pairs over preference.max_length=%d",
        info["source"],
        info["train_pairs"],
        info["eval_pairs"],
        info["skipped_malformed_rows"],
        info["skipped_too_long"],
        limit,
    )
    return train, evals, info


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


def rm(cfg: TrainConfig) -> Path:
    """``rlsys rm``: train a reward model on preference pairs; it lands in
    ``checkpoints/final`` as a sequence-classification model for ``reward.model.paths``."""
    from rlsys.data.preferences import reward_model_rows
    from rlsys.placement import plan_placement
    from rlsys.rm import run_rm
    from rlsys.workers.learner import LearnerGroup
    from rlsys.workers.rollout import RolloutPool

    started = time.perf_counter()
    run_dir, tokenizer, task, start, warm = _preference_setup(cfg, "rm")
    placement = plan_placement(cfg, Roles())
    rollout = None
    if cfg.preference.samples_policy:
        rollout = RolloutPool(cfg.rollout, placement.rollout, start, cfg.model.dtype)
    try:
        train, evals, data = _pairs(
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
        cfg.learner, placement.learner, start, cfg.model.dtype, 1.0, role="reward"
    )
    tracker = Tracker(run_dir, cfg.tracking, run_dir.name, _plain(cfg), cfg.rm.max_steps, "rm ")
    final = run_dir / "checkpoints" / "final"
    try:
        result = run_rm(cfg.rm, learner, train, evals, cfg.run.seed, tracker)
        learner.save_hf(str(final))
    finally:
        tracker.close()
        learner.shutdown()
    log.info(
        "reward model: held-out pairwise accuracy %.3f -> %.3f; use it with "
        "reward.model.paths=[%s]",
        result.eval_pairwise_accuracy_before,
        result.eval_pairwise_accuracy,
        final,
    )
    return _preference_summary(run_dir, result, data, start, warm, final, started)


def dpo(cfg: TrainConfig) -> Path:
    """``rlsys dpo``: DPO / IPO / conservative DPO of the policy on preference pairs; the
    policy lands in ``checkpoints/final``."""
    from rlsys.data.preferences import policy_rows
    from rlsys.dpo import run_dpo
    from rlsys.pools import start_pools

    started = time.perf_counter()
    run_dir, tokenizer, task, start, warm = _preference_setup(cfg, "dpo")
    pools = start_pools(cfg, start, Roles(), temperature=1.0)
    tracker = Tracker(run_dir, cfg.tracking, run_dir.name, _plain(cfg), cfg.dpo.max_steps, "dpo ")
    final = run_dir / "checkpoints" / "final"
    try:
        collector = _collector(cfg, pools, tokenizer)
        train, evals, data = _pairs(cfg, tokenizer, task, policy_rows(collector), pools.generate)
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
    engine = ENGINES.get(cfg.rollout.engine)(
        path, cfg.rollout.dtype or cfg.model.dtype, cfg.rollout
    )
    collector = RolloutCollector.for_task(
        lambda prompts, sampling, seed, budgets: engine.generate(prompts, sampling, budgets),
        tokenizer,
        cfg.task,
        cfg.reward,
    )
    result = collector.evaluate(
        task.eval[: cfg.eval.num_prompts], cfg.eval.max_new_tokens or task.max_new_tokens
    )
    return {"model": path, **dataclasses.asdict(result)}


def _plain(cfg: TrainConfig) -> dict:
    import yaml

    return yaml.safe_load(to_yaml(cfg))


def export_policy(checkpoint: str, out_dir: str) -> Path:
    """``rlsys export``: the policy of a checkpoint (``checkpoints/step_<N>`` or its
    ``policy/``) as a Hugging Face directory, read straight from the shards."""
    from rlsys.backends.export import export_hf
    from rlsys.checkpoint import CheckpointError, problem

    path = Path(checkpoint).expanduser().resolve()
    if (path / "policy").is_dir():
        reason = problem(path)
        if reason is not None:
            raise CheckpointError(f"checkpoint {path} is not usable: {reason}")
        path = path / "policy"
    out = Path(out_dir).expanduser().resolve()
    try:
        export_hf(str(path), str(out))
    except FileNotFoundError as exc:  # the backend's own errors are CheckpointErrors
        raise CheckpointError(str(exc)) from exc
    return out
