"""Supervised fine-tuning on the learner backend, with greedy evals through the rollout pool.

Used by ``rlsys sft`` and by the warm start of ``rlsys train``. Accuracy on small tasks jumps
abruptly during SFT, so the loop evaluates every ``sft.eval_every`` steps and stops at the
first eval reaching ``sft.target_accuracy`` instead of after a fixed number of steps.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from rlsys.algorithms.objectives import SFTObjective
from rlsys.config.schema import SFTConfig
from rlsys.data.collate import attach_pixels, pack
from rlsys.data.sampler import PromptSampler
from rlsys.data.tasks import TaskSplits
from rlsys.run.progress import Progress
from rlsys.run.tracking import Tracker
from rlsys.trainers.collector import RolloutCollector
from rlsys.workers.pools import Pools

log = logging.getLogger(__name__)


@dataclass
class SFTResult:
    """What an SFT run reached."""

    steps: int
    eval_accuracy: float
    wall_s: float


def run_sft(
    cfg: SFTConfig,
    pools: Pools,
    collector: RolloutCollector,
    task: TaskSplits,
    tokenizer,
    seed: int,
    tracker: Tracker | None = None,
) -> SFTResult:
    """Train on (prompt, answer + EOS) pairs (multi-turn tasks: the environment's
    demonstrations, its observations masked out) until ``cfg.target_accuracy`` or
    ``cfg.max_steps``."""
    pools.learner.set_lr(cfg.lr)
    sampler = PromptSampler(task.train, cfg.batch_size, shuffle=True, seed=seed)
    eval_prompts = task.eval[: cfg.eval_prompts]
    started = time.perf_counter()
    accuracy, step = 0.0, 0
    progress = Progress(cfg.max_steps, start_step=0)  # the warm start's own progress lines
    for step in range(1, cfg.max_steps + 1):
        prompts, prompt_ids = collector.encode(sampler.next_batch())
        targets = [collector.demonstration(p) for p in prompts]  # (ids, loss mask) each
        batch = pack(
            prompt_ids,
            [ids for ids, _ in targets],
            tokenizer.pad_token_id,
            response_masks=[mask for _, mask in targets],
        )
        attach_pixels(batch, [p.pixels for p in prompts])
        metrics = {
            f"sft/{k}": v
            for k, v in pools.learner.train_step(
                batch, SFTObjective(), seed + step, num_mini_batches=1, epochs=1
            ).items()
        }
        done = step == cfg.max_steps
        if step % cfg.eval_every == 0 or done:
            pools.sync_weights(version=step)
            accuracy = collector.evaluate(eval_prompts, task.max_new_tokens).accuracy
            metrics["eval/accuracy"] = accuracy
            done = done or (cfg.target_accuracy is not None and accuracy >= cfg.target_accuracy)
        if "eval/accuracy" in metrics:
            if tracker is not None:
                tracker.log(step, metrics)
            elif done or step % (5 * cfg.eval_every) == 0:  # warm start: console progress
                log.info(
                    "sft step %d/%d: loss %.4f, eval accuracy %.3f (%s at most)",
                    step,
                    cfg.max_steps,
                    metrics["sft/loss"],
                    accuracy,
                    progress.text(step),
                )
        if done:
            break
    return SFTResult(steps=step, eval_accuracy=accuracy, wall_s=time.perf_counter() - started)
