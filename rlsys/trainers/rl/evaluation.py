"""What an evaluation of ``rlsys train`` measures: greedy accuracy of the engines' current
weights on the reported held-out prompts (the first ``eval.num_prompts``), per value of
``eval.group_by``, and on the validation prompts after them (``eval.validation_prompts``),
whose best picks the policy kept in checkpoints/best (``selection.py``)."""

from __future__ import annotations

from rlsys.config.schema import TrainConfig
from rlsys.data.tasks import TaskSplits
from rlsys.resolve.inputs import validation_split
from rlsys.trainers.collector import RolloutCollector, check_group_by


class HeldOut:
    """The held-out prompts a run evaluates on, and the evaluation itself."""

    def __init__(self, cfg: TrainConfig, task: TaskSplits, collector: RolloutCollector) -> None:
        self.group_by, self.collector = cfg.eval.group_by, collector
        self.reported = task.eval[: cfg.eval.num_prompts]
        check_group_by(self.group_by, self.reported)
        self.validation = (
            validation_split(task.eval, cfg.eval.num_prompts, cfg.eval.validation_prompts)
            if cfg.eval.validation_prompts
            else []
        )
        self.budget = cfg.eval.max_new_tokens or task.max_new_tokens

    def evaluate(self) -> dict[str, float]:
        """The ``eval/*`` metrics of the engines' current weights (call with the rollout
        loops held: ``pipeline.gate.shut()``, or before they start)."""
        result = self.collector.evaluate(self.reported, self.budget, self.group_by)
        metrics = {
            "eval/accuracy": result.accuracy,
            "eval/reward_mean": result.mean_reward,
            "eval/response_tokens": result.mean_response_tokens,
            "eval/num_prompts": result.num_prompts,
            **{f"eval/accuracy_{value}": acc for value, acc in result.accuracy_by.items()},
        }
        if self.validation:
            metrics["eval/validation_accuracy"] = self.collector.evaluate(
                self.validation, self.budget, None
            ).accuracy
        return metrics
