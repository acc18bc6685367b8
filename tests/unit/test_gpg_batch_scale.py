"""GPG's batch scale in its two forms, the paper's (the default) and verl's
(algorithm.advantage_args.batch_scale=verl): hand-computed on a 14-row batch with a singleton
group (arithmetic in the comments), and the setting from the config to the estimator."""

from __future__ import annotations

import numpy as np
import pytest

from rlsys.algorithms import advantages as A
from rlsys.algorithms.estimators import ADVANTAGES, AdvantageInputs, GpgSettings
from rlsys.algorithms.recipe import Recipe
from rlsys.config.algorithm import AlgorithmConfig
from rlsys.config.errors import ConfigError
from rlsys.config.schema import TrainConfig
from rlsys.resolve import load_config, resolve

# 14 rows in verl's layout (a group id per row): groups of 4, 4, 5 and 1.
REWARDS = np.array([1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1], np.float64)
GROUPS = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3])


def test_paper_scale_on_a_batch_with_a_singleton_group():
    # Tied groups: group 1 (four 1s) and group 3 (one sample ties with itself): M = 4 + 1 = 5,
    # alpha = B / (B - M) = 14 / 9.
    # group 0: mean 0.5 -> +-0.5 -> +-0.5 * 14 / 9 = +-7 / 9
    # group 2: mean 1 / 5 = 0.2 -> 0.8, -0.2 -> 0.8 * 14 / 9 = 11.2 / 9, -0.2 * 14 / 9 = -2.8 / 9
    # groups 1 and 3: 0
    adv = A.gpg_advantages(REWARDS, "paper", GROUPS)
    expected = [7, -7, -7, 7, 0, 0, 0, 0, 11.2, -2.8, -2.8, -2.8, -2.8, 0]
    np.testing.assert_allclose(adv, np.array(expected) / 9, rtol=1e-6, atol=1e-7)


def test_verl_scale_on_a_batch_with_a_singleton_group():
    # Non-zero rewards: 2 (group 0) + 4 (group 1) + 1 (group 2) + 1 (group 3) = 8,
    # alpha = B / 8 = 14 / 8 = 1.75.
    # group 0: +-0.5 * 1.75 = +-0.875; group 1: tied, 0
    # group 2: 0.8 * 1.75 = 1.4, -0.2 * 1.75 = -0.35
    # group 3 (singleton): centred on 0, not on its own reward: (1 - 0) * 1.75 = 1.75
    adv = A.gpg_advantages(REWARDS, "verl", GROUPS)
    expected = [0.875, -0.875, -0.875, 0.875, 0, 0, 0, 0, 1.4, -0.35, -0.35, -0.35, -0.35, 1.75]
    np.testing.assert_allclose(adv, expected, rtol=1e-6, atol=1e-7)
    # the two forms differ by 1.75 on the singleton, 11.2 / 9 - 1.4 = -0.1556 on group 2's 1
    paper = A.gpg_advantages(REWARDS, "paper", GROUPS)
    assert abs(float(adv[13] - paper[13])) == pytest.approx(1.75)


def test_verl_scale_counts_non_zero_rewards_not_informative_samples():
    # Non-binary rewards in equal groups of 2: (2, 0), (0, 0), (-1, -1).
    # verl: non-zero rewards 2, -1, -1 -> 3, alpha = 6 / 3 = 2; group 0: +-1 -> +-2
    # paper: tied groups 1 and 2 -> M = 4, alpha = 6 / 2 = 3; group 0: +-3
    rewards = np.array([[2.0, 0.0], [0.0, 0.0], [-1.0, -1.0]])
    np.testing.assert_allclose(A.gpg_advantages(rewards, "verl"), [[2, -2], [0, 0], [0, 0]])
    np.testing.assert_allclose(A.gpg_advantages(rewards, "paper"), [[3, -3], [0, 0], [0, 0]])
    # all rewards 0: verl's count is clamped to 1 and every advantage is still 0
    assert not A.gpg_advantages(np.zeros((2, 3)), "verl").any()


def test_equal_groups_through_group_ids_match_the_grouped_form():
    rng = np.random.default_rng(3)
    rewards = rng.integers(0, 3, size=(5, 4)).astype(float)
    ids = np.repeat([7, 3, 9, 1, 5], 4)  # any labels, in any order
    for scale in A.GPG_BATCH_SCALES:
        flat = A.gpg_advantages(rewards.reshape(-1), scale, ids)
        np.testing.assert_array_equal(flat, A.gpg_advantages(rewards, scale).reshape(-1))


def test_bad_inputs_name_what_is_wrong():
    with pytest.raises(ValueError, match=r"batch_scale='mean' is not one of"):
        A.gpg_advantages(np.ones((1, 2)), "mean")
    with pytest.raises(ValueError, match="group ids"):
        A.gpg_advantages(np.ones(3), "paper", np.zeros(2))


def test_the_setting_reaches_the_estimator_from_the_config():
    cfg = load_config(["algorithm=gpg", "algorithm.advantage_args.batch_scale=verl"])
    recipe = Recipe(cfg.algorithm, group_size=2, max_new_tokens=2)
    assert recipe.advantage_settings == GpgSettings(batch_scale="verl")
    assert Recipe(AlgorithmConfig(advantage="gpg"), 2, 2).advantage_settings.batch_scale == "paper"
    # groups (1, 0) and (1, 1): verl alpha = 4 / 3 -> +-2 / 3; paper alpha = 4 / 2 -> +-1
    mask = np.ones((4, 2), np.float32)
    x = AdvantageInputs(np.array([1.0, 0.0, 1.0, 1.0]), mask, 2)
    for scale, value in (("verl", 2 / 3), ("paper", 1.0)):
        adv = ADVANTAGES.get("gpg")(x, GpgSettings(batch_scale=scale)).advantages
        np.testing.assert_allclose(adv[:, 0], [value, -value, 0, 0], rtol=1e-6)


def test_a_bad_batch_scale_fails_at_load_naming_its_key():
    algo = AlgorithmConfig(advantage="gpg", advantage_args={"batch_scale": "verl09"})
    with pytest.raises(ConfigError, match=r"algorithm.advantage_args.batch_scale='verl09'"):
        resolve(TrainConfig(algorithm=algo))
