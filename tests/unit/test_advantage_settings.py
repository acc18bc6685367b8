"""Each advantage estimator receives its own settings object: the flat algorithm.* keys feed
it (mapped in one place), algorithm.advantage_args overrides any field by name, and a bad
setting fails at load naming its key."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rlsys.algorithms.estimators import (
    ADVANTAGES,
    AdvantageInputs,
    DiscountSettings,
    GaeSettings,
    GigpoSettings,
    GpgSettings,
    GroupNormSettings,
    PassAtKSettings,
    advantage_settings,
)
from rlsys.algorithms.recipe import Recipe
from rlsys.config.algorithm import AlgorithmConfig
from rlsys.config.errors import ConfigError
from rlsys.config.schema import RolloutConfig, TrainConfig
from rlsys.resolve import resolve
from rlsys.types import TrainBatch


def test_inputs_carry_arrays_only():
    fields = {f.name for f in dataclasses.fields(AdvantageInputs)}
    assert fields == {
        "rewards",
        "mask",
        "group_size",
        "kl_penalty",
        "values",
        "baseline_rewards",
        "tree_segments",
        "turns",
    }


def test_every_builtin_estimator_registers_its_settings():
    expected = {
        "gae": GaeSettings,
        "gigpo": GigpoSettings,
        "gpg": GpgSettings,
        "grpo": GroupNormSettings,
        "treepo": GroupNormSettings,
        "treerl": GroupNormSettings,
        "pass_at_k": PassAtKSettings,
    }
    for name in ADVANTAGES.names():
        assert ADVANTAGES.settings(name) is expected.get(name, DiscountSettings), name


def test_the_flat_keys_feed_the_settings():
    algo = AlgorithmConfig(
        advantage="gigpo", gamma=0.9, normalize_std=False, gigpo_step_weight=0.5, lam=0.3
    )
    assert advantage_settings(algo) == GigpoSettings(0.9, False, 0.5)
    gae = advantage_settings(dataclasses.replace(algo, advantage="gae"))
    assert gae == GaeSettings(gamma=0.9, lam=0.3)
    pak = advantage_settings(AlgorithmConfig(advantage="pass_at_k", pass_k=2))
    assert pak == PassAtKSettings(gamma=1.0, k=2)


def test_advantage_args_override_the_flat_keys_and_reach_the_estimator():
    algo = AlgorithmConfig(advantage="gae", lam=0.95, advantage_args={"lam": 1.0})
    recipe = Recipe(algo, group_size=1, max_new_tokens=2)
    assert recipe.advantage_settings == GaeSettings(gamma=1.0, lam=1.0)
    mask = np.ones((2, 2), np.float32)
    batch = TrainBatch(
        input_ids=np.zeros((2, 3), np.int64),
        attention_mask=np.ones((2, 3), np.int64),
        loss_mask=mask,
        behaviour_logprobs=np.zeros_like(mask),
        rewards=np.array([1.0, 0.0], np.float32),
        values=np.zeros_like(mask),
    )
    # lam = 1 with zero values: every token's advantage is the undiscounted return
    np.testing.assert_allclose(recipe.advantages(batch).advantages, [[1, 1], [0, 0]])


@pytest.mark.parametrize(
    ("algo", "needle"),
    [
        (
            AlgorithmConfig(advantage="gae", advantage_args={"lambda": 0.9}),
            r"algorithm.advantage_args.lambda is not a setting of algorithm.advantage=gae; "
            r"its settings are \['gamma', 'lam'\]",
        ),
        (
            AlgorithmConfig(advantage="gae", advantage_args={"lam": 2}),
            r"algorithm.advantage_args.lam=2 must be in \[0, 1\]",
        ),
        (
            AlgorithmConfig(advantage="grpo", advantage_args={"gamma": 0}),
            r"algorithm.advantage_args.gamma=0 must be in \(0, 1\]",
        ),
        (
            AlgorithmConfig(advantage="gigpo", advantage_args={"step_weight": -1}),
            r"algorithm.advantage_args.step_weight=-1 must be >= 0",
        ),
        (
            AlgorithmConfig(advantage="pass_at_k", advantage_args={"k": 0}),
            r"algorithm.advantage_args.k=0 must be >= 1",
        ),
    ],
)
def test_a_bad_setting_fails_at_load_naming_its_key(algo, needle):
    with pytest.raises(ConfigError, match=needle):
        resolve(TrainConfig(algorithm=algo))


def test_pass_at_k_checks_the_k_its_settings_get_against_the_group():
    algo = AlgorithmConfig(advantage="pass_at_k", pass_k=2, advantage_args={"k": 8})
    with pytest.raises(ConfigError, match=r"algorithm.advantage_args.k=8 with rollout.n_samples"):
        resolve(TrainConfig(algorithm=algo, rollout=RolloutConfig(n_samples=8)))
