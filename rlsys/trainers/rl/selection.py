"""The best policy of a run by a validation split (``eval.validation_prompts``).

An RL policy on a near-deterministic task swings between evaluations (docs/demo-tuning.md:
the tens digit of a sum tips on a dozen problems at a time), so the last step's weights are
one draw from that swing. With ``eval.validation_prompts: V`` every evaluation also scores
the V held-out prompts after the first ``eval.num_prompts``, and the policy with the highest
validation accuracy so far is exported to ``checkpoints/best`` (a Hugging Face directory)
with ``selection.json``: its step and both accuracies. The choice never reads the reported
held-out accuracy, so that figure at the chosen step is not biased by the choice (Hugging
Face Trainer's ``load_best_model_at_end`` does the same with its own eval split).

The record lives beside the weights: a resume, or a recovery that rewinds to an earlier
checkpoint, keeps the best policy written so far, unless the validation prompts differ (a
changed ``eval.*`` or ``task.*``): then the choice starts over. A new export is assembled in
``.tmp-best`` and swapped in through ``.old-best``; whichever step a crash interrupts, the
next process finds one complete ``best``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlsys.checkpoint.store import CheckpointError, CheckpointStore, fsync_dir, fsync_tree
from rlsys.types import Prompt

log = logging.getLogger(__name__)

RECORD = "selection.json"
METRIC = "eval/validation_accuracy"


@dataclass(frozen=True)
class Selection:
    """The chosen policy: its step, validation accuracy and reported held-out accuracy."""

    step: int
    validation_accuracy: float
    accuracy: float


def validation_key(prompts: Sequence[Prompt]) -> str:
    """A digest of the validation prompts and answers: a record made on other prompts is not
    compared with."""
    digest = hashlib.sha256()
    for prompt in prompts:
        digest.update(f"{prompt.text}\x1f{prompt.answer}\x1e".encode())
    return digest.hexdigest()[:16]


class BestPolicy:
    """Exports the policy to ``directory`` whenever an evaluation's validation accuracy
    beats every earlier one (``save(path)`` writes the policy as a Hugging Face directory;
    ``key``: ``validation_key`` of the prompts the accuracy is measured on)."""

    def __init__(self, directory: Path, save: Callable[[str], None], key: str) -> None:
        self.directory, self.save, self.key = directory, save, key
        self._staged = directory.with_name(f".tmp-{directory.name}")
        self._retired = directory.with_name(f".old-{directory.name}")
        self.chosen = self._read()

    @classmethod
    def for_run(
        cls,
        validation: Sequence[Prompt],
        checkpoints: CheckpointStore | None,
        save: Callable[[str], None],
    ) -> BestPolicy | None:
        """The run's keeper in ``checkpoints/best``, or None without validation prompts."""
        if not validation:
            return None
        if checkpoints is None:
            raise ValueError(
                "eval.validation_prompts keeps a policy in the run's checkpoints/, which only "
                "`rlsys train` has: set eval.validation_prompts=0 here"
            )
        return cls(checkpoints.root / "best", save, validation_key(validation))

    def summary(self) -> dict:
        """summary.json's ``best_model`` and ``selected`` (None until the first choice)."""
        chosen = self.chosen
        return {
            "best_model": str(self.directory) if chosen else None,
            "selected": dataclasses.asdict(chosen) if chosen else None,
        }

    def start_over(self) -> None:
        """Forget the record on disk (a run starting from step 0 in a directory an earlier
        run left a best in): the next ``consider`` replaces it."""
        self.chosen = None

    def consider(self, step: int, metrics: dict[str, float]) -> bool:
        """Export the current policy if its validation accuracy (``metrics``, this step's
        evaluation) is the best yet; True when it was exported."""
        score = metrics[METRIC]
        if self.chosen is not None and score <= self.chosen.validation_accuracy:
            return False
        started = time.perf_counter()
        chosen = Selection(step, score, metrics["eval/accuracy"])
        for stale in (self._staged, self._retired):
            shutil.rmtree(stale, ignore_errors=True)
        self.save(str(self._staged))
        record = {**dataclasses.asdict(chosen), "validation_set": self.key}
        (self._staged / RECORD).write_text(json.dumps(record, indent=1))
        fsync_tree(self._staged)
        if self.directory.exists():
            os.rename(self.directory, self._retired)
        os.rename(self._staged, self.directory)
        fsync_dir(self.directory.parent)
        shutil.rmtree(self._retired, ignore_errors=True)
        self.chosen = chosen
        log.info(
            "best policy so far: step %d, validation %.3f, held-out %.3f -> %s (%.1fs)",
            step,
            score,
            chosen.accuracy,
            self.directory,
            time.perf_counter() - started,
        )
        return True

    def _read(self) -> Selection | None:
        """The record an earlier process of this run left, if any, for these prompts."""
        if self.directory.exists():  # a crash after the swap left the old one: drop it
            shutil.rmtree(self._retired, ignore_errors=True)
        elif self._retired.exists():  # a crash between the two renames: the old one stands
            os.rename(self._retired, self.directory)
        path = self.directory / RECORD
        if not path.is_file():
            return None
        try:
            raw = json.loads(path.read_text())
            chosen = Selection(raw["step"], raw["validation_accuracy"], raw["accuracy"])
            key = raw["validation_set"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(
                f"{path} is not a selection record ({type(exc).__name__}: {exc}); delete "
                f"{self.directory} to start the choice of the best policy over"
            ) from None
        numbers = (chosen.validation_accuracy, chosen.accuracy)
        if (
            not isinstance(chosen.step, int)
            or chosen.step < 0
            or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers)
        ):
            raise CheckpointError(
                f"{path} holds {raw!r}, not a step and two accuracies; delete "
                f"{self.directory} to start the choice of the best policy over"
            )
        if key != self.key:
            log.warning(
                "%s was chosen on other validation prompts (eval.* or task.* changed): the "
                "choice starts over, the first evaluation replacing it",
                self.directory,
            )
            return None
        return chosen
