"""The registry type every extension kind uses: names, traits, errors, and that adding an
advantage estimator is one function plus one registration line."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from rlsys.algorithms.estimators import ADVANTAGES, AdvantageInputs, Advantages
from rlsys.algorithms.recipe import Recipe
from rlsys.algorithms.settings import NoSettings
from rlsys.algorithms.traits import compares_group, uses_critic
from rlsys.config.algorithm import AlgorithmConfig
from rlsys.config.errors import ConfigError
from rlsys.config.learner import LearnerConfig
from rlsys.config.schema import ReferenceConfig, RolloutConfig, TaskConfig, TrainConfig
from rlsys.data.tasks import TASKS, TaskSplits, load_task
from rlsys.registry import Registry
from rlsys.resolve import resolve
from rlsys.types import Prompt, TrainBatch


def _colours() -> Registry[int]:
    colours: Registry[int] = Registry("colour", "paint.colour")
    colours.register("red", warm=True)(1)
    colours.register("blue")(2)
    colours.register("orange", warm=True, bright=True)(3)
    return colours


def test_unknown_name_names_the_key_the_value_and_the_known_names():
    colours = _colours()
    with pytest.raises(ConfigError, match=r"paint\.colour='green'.*\['blue', 'orange', 'red'\]"):
        colours.check("green")
    with pytest.raises(ConfigError, match=r"paint\.colour='green'"):
        colours.get("green")
    with pytest.raises(ConfigError, match=r"wall\.colour='green'"):
        colours.check("green", key="wall.colour")
    assert colours.get("red") == 1 and "red" in colours and "green" not in colours


def test_traits_filter_names_and_default_to_false():
    colours = _colours()
    assert colours.names() == ["blue", "orange", "red"]
    assert colours.names(warm=True) == ["orange", "red"]
    assert colours.names(warm=True, bright=True) == ["orange"]
    assert colours.names(warm=False) == ["blue"]
    assert colours.trait("red", "warm") is True
    assert colours.trait("blue", "warm") is False
    assert colours.trait("blue", "shade", default="none") == "none"


def test_registering_a_name_twice_fails():
    colours = _colours()
    with pytest.raises(ValueError, match="'red' is registered twice"):
        colours.register("red")(4)
    assert colours.get("red") == 1
    colours.unregister("red")
    colours.register("red")(4)
    assert colours.get("red") == 4


@pytest.mark.parametrize(
    ("sections", "needle"),
    [
        (dict(algorithm=AlgorithmConfig(advantage="nope")), "algorithm.advantage='nope'"),
        (dict(algorithm=AlgorithmConfig(policy_loss="trpo")), "algorithm.policy_loss='trpo'"),
        (dict(algorithm=AlgorithmConfig(loss_agg="sum")), "algorithm.loss_agg='sum'"),
        (dict(algorithm=AlgorithmConfig(kl_estimator="k4")), "algorithm.kl_estimator='k4'"),
        (dict(algorithm=AlgorithmConfig(off_policy="is")), "algorithm.off_policy='is'"),
        (dict(rollout=RolloutConfig(engine="sglang")), "rollout.engine='sglang'"),
        (dict(learner=LearnerConfig(backend="megatron")), "learner.backend='megatron'"),
        (dict(task=TaskConfig(name="sudoku")), "task.name='sudoku'"),
        (dict(reference=ReferenceConfig(backend="megatron")), "reference.backend='megatron'"),
    ],
)
def test_config_validates_names_against_the_registries(sections, needle):
    """The config holds names as data; resolving it looks each one up in its registry."""
    with pytest.raises(ConfigError, match="use one of") as err:
        resolve(TrainConfig(**sections))
    assert needle in str(err.value)


def test_config_validation_does_not_import_torch():
    """The registries the config asks live in torch-free modules (or behind lazy builders)."""
    code = (
        "import sys; from rlsys.config.schema import TrainConfig; "
        "from rlsys.resolve import resolve; resolve(TrainConfig()); "
        "assert 'torch' not in sys.modules, 'config validation imported torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.fixture
def best_of_group():
    """A new estimator, registered for one test: the advantage is 1 for the best sample of
    each prompt and 0 for the others."""

    @ADVANTAGES.register("best_of_group", group=True)
    def best_of_group(x: AdvantageInputs, s: NoSettings) -> Advantages:
        rewards = np.asarray(x.rewards).reshape(-1, x.group_size)
        best = (rewards == rewards.max(-1, keepdims=True)).astype(np.float32).reshape(-1, 1)
        return Advantages(best * x.mask)

    yield "best_of_group"
    ADVANTAGES.unregister("best_of_group")


def test_a_registered_estimator_is_a_valid_config_name_and_is_used(best_of_group):
    cfg = TrainConfig(algorithm=AlgorithmConfig(advantage=best_of_group))
    assert compares_group(cfg.algorithm) and not uses_critic(cfg.algorithm)
    mask = np.ones((4, 2), np.float32)
    batch = TrainBatch(
        input_ids=np.zeros((4, 3), np.int64),
        attention_mask=np.ones((4, 3), np.int64),
        loss_mask=mask,
        behaviour_logprobs=np.zeros_like(mask),
        rewards=np.array([0.0, 1.0, 3.0, 2.0], np.float32),
    )
    out = Recipe(cfg.algorithm, group_size=2, max_new_tokens=2).advantages(batch)
    np.testing.assert_array_equal(out.advantages[:, 0], [0.0, 1.0, 1.0, 0.0])
    with pytest.raises(ConfigError, match="rollout.n_samples=1"):
        resolve(
            TrainConfig(
                algorithm=AlgorithmConfig(advantage=best_of_group, filter_uniform_groups=False),
                rollout=RolloutConfig(n_samples=1),
            )
        )


def test_a_registered_task_is_a_valid_config_name_and_is_loaded():
    @TASKS.register("echo")
    def echo(cfg: TaskConfig, seed: int) -> TaskSplits:
        prompts = [Prompt(i, f"say {i}:", str(i)) for i in range(cfg.train_size + cfg.eval_size)]
        return TaskSplits(prompts[cfg.eval_size :], prompts[: cfg.eval_size], 4)

    try:
        splits = load_task(TaskConfig(name="echo", train_size=6, eval_size=2), seed=0)
    finally:
        TASKS.unregister("echo")
    assert [p.answer for p in splits.eval] == ["0", "1"] and len(splits.train) == 6
    with pytest.raises(ConfigError, match="task.name='echo'"):
        resolve(TrainConfig(task=TaskConfig(name="echo")))
