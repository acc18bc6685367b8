"""The controller state of a checkpoint (``trainer.json``, written by ``Recovery.state_dict``),
checked before any of it is used.

A checkpoint is a file people copy, edit and download, and its state steers the resumed run:
a step of NaN once ended one at once ("finished at step nan") and cut its metrics.jsonl to
the first record. So every value is checked for its type, for finite numbers and for its
range (0 <= step <= ``trainer.total_steps``, the step the directory is named after; the
policy version at most the step), and a state that fails is treated like a damaged
checkpoint: resume falls back to the previous one, with a warning naming the file and the
value (docs/checkpoints.md). How deep the file may nest is bounded where it is parsed
(``rlsys.checkpoint.state_file.MAX_DEPTH``).
"""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path
from typing import Any

import numpy as np

from rlsys.checkpoint.store import TRAINER_STATE, CheckpointError, read_trainer_state, step_of
from rlsys.trainers.rl.state import RunTotals
from rlsys.types import RolloutGroup


class _Invalid(ValueError):
    """A value of the state that a run never saves."""


def read_run_state(path: Path, total_steps: int) -> dict:
    """The controller state of the checkpoint at ``path``, checked; CheckpointError names the
    file and the first value that is wrong."""
    saved = read_trainer_state(path)
    try:
        _check(saved, path.name, step_of(path), total_steps)
    except _Invalid as exc:
        raise CheckpointError(f"{path / TRAINER_STATE}: {exc}") from None
    return saved


def _check(saved: dict, name: str, step: int, total_steps: int) -> None:
    totals = _dict(saved, "totals")
    _check_totals(totals)
    steps = _field(totals, "steps", "totals.")
    if steps > total_steps:
        raise _Invalid(
            f"totals.steps is {steps}, beyond trainer.total_steps={total_steps}; to continue "
            f"this run, resume with trainer.total_steps of at least {steps}"
        )
    if steps != step:
        raise _Invalid(f"totals.steps is {steps}, but {name} is of step {step}")
    version = _count(_field(saved, "version"), "version")
    if version > steps:
        raise _Invalid(f"version is {version}, beyond totals.steps={steps} (one per step)")
    marks = _field(saved, "marks")
    if not isinstance(marks, list) or len(marks) != 2:
        raise _Invalid(f"marks is {marks!r}, not [prompts drawn, samples filtered]")
    _counts(marks, "marks")
    _amount(_field(saved, "kl_coef"), "kl_coef")
    collector = _dict(saved, "collector")
    for key in ("reward_errors", "skipped_prompts"):
        _count(_field(collector, key, "collector."), f"collector.{key}")
    _check_buffer(_dict(saved, "buffer"))
    _check_sampler(_dict(saved, "sampler"))
    pipeline = _dict(saved, "pipeline")
    _count(_field(pipeline, "drawn", "pipeline."), "pipeline.drawn")
    for key in ("calls", "continued"):
        _counts(_list(pipeline, key, "pipeline."), f"pipeline.{key}")
    if "replay" in pipeline:
        _dict(pipeline, "replay", "pipeline.")
    _check_rng(_dict(saved, "rng"))
    run_info = _dict(saved, "run_info")
    for key in ("model_path", "tracker_run_id"):
        if not isinstance(run_info.get(key), (str, type(None))):
            raise _Invalid(f"run_info.{key} is {run_info[key]!r}, not a string")
    if not isinstance(run_info.get("warm_start"), (dict, type(None))):
        raise _Invalid(f"run_info.warm_start is {run_info['warm_start']!r}, not a dict")


def _check_totals(totals: dict) -> None:
    """Each field as its default in ``RunTotals`` is: a count, a finite number, a list of
    records; one an older rlsys did not save keeps its default."""
    fields = {f.name: f for f in dataclasses.fields(RunTotals)}
    unknown = sorted(set(totals) - set(fields))
    if unknown:
        raise _Invalid(f"totals has fields {unknown} that this rlsys does not know")
    for name, value in totals.items():
        default, where = fields[name].default, f"totals.{name}"
        if default is None:
            _amount(value, where, optional=True)
        elif isinstance(default, int):
            _count(value, where)
        elif isinstance(default, float):
            _amount(value, where)
        elif not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise _Invalid(f"{where} is {_short(value)}, not a list of records")


def _check_buffer(buffer: dict) -> None:
    stats = _dict(buffer, "stats", "buffer.")
    for key in ("issued", "admitted", "released"):
        _count(_field(stats, key, "buffer.stats."), f"buffer.stats.{key}")
    _count(stats.get("replayed", 0), "buffer.stats.replayed")
    _counts(_dict(stats, "dropped", "buffer.stats."), "buffer.stats.dropped")
    for key in ("version", "steps", "issued"):
        _count(_field(buffer, key, "buffer."), f"buffer.{key}")
    _counts(_dict(buffer, "dropped", "buffer."), "buffer.dropped")
    groups = _list(buffer, "groups", "buffer.")
    if not all(isinstance(g, RolloutGroup) for g in groups):
        raise _Invalid("buffer.groups holds something other than rollout groups")


def _check_sampler(sampler: dict) -> None:
    """The epoch sampler's position, or the curriculum's counts (rlsys.data)."""
    if "epoch" in sampler:
        for key in ("epoch", "position"):
            _count(_field(sampler, key, "sampler."), f"sampler.{key}")
        return
    _count(_field(sampler, "draws", "sampler."), "sampler.draws")
    for key in ("right", "wrong", "mixed", "uniform"):
        if key in sampler:
            _amounts(_list(sampler, key, "sampler."), f"sampler.{key}")
    for index, counts in _dict(sampler, "prompts", "sampler.", optional=True).items():
        if not index.isdigit() or not isinstance(counts, list):
            raise _Invalid(f"sampler.prompts[{index!r}] is {_short(counts)}")
        _amounts(counts, f"sampler.prompts[{index!r}]")


def _check_rng(rng: dict) -> None:
    """Loaded into throwaway generators: what they refuse, the run's would too."""
    try:
        random.Random().setstate(_field(rng, "python", "rng."))
    except (TypeError, ValueError, OverflowError) as exc:
        raise _Invalid(f"rng.python is not a Python RNG state ({exc})") from None
    try:
        np.random.RandomState().set_state(_field(rng, "numpy", "rng."))
    except (TypeError, ValueError, OverflowError) as exc:
        raise _Invalid(f"rng.numpy is not a NumPy RNG state ({exc})") from None


# ---- one value ---------------------------------------------------------------------------


def _field(tree: dict, key: str, prefix: str = "") -> Any:
    if key not in tree:
        raise _Invalid(f"{prefix}{key} is missing")
    return tree[key]


def _dict(tree: dict, key: str, prefix: str = "", optional: bool = False) -> dict:
    if optional and key not in tree:
        return {}
    value = _field(tree, key, prefix)
    if not isinstance(value, dict):
        raise _Invalid(f"{prefix}{key} is {_short(value)}, not a dict")
    return value


def _list(tree: dict, key: str, prefix: str = "") -> list:
    value = _field(tree, key, prefix)
    if not isinstance(value, list):
        raise _Invalid(f"{prefix}{key} is {_short(value)}, not a list")
    return value


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Invalid(f"{where} is {_short(value)}, not a count (an integer >= 0)")
    return value


def _counts(values: list | dict, where: str) -> None:
    items = values.items() if isinstance(values, dict) else enumerate(values)
    for key, value in items:
        _count(value, f"{where}[{key!r}]")


def _amount(value: Any, where: str, optional: bool = False) -> None:
    if optional and value is None:
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0:
        raise _Invalid(f"{where} is {_short(value)}, not a finite number >= 0")


def _amounts(values: list, where: str) -> None:
    for i, value in enumerate(values):
        _amount(value, f"{where}[{i}]")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."
