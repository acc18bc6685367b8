"""Every algorithm preset trains end to end on real Ray actors (policy, rollout, reference and
critic pools as the preset needs), plus DAPO's sampling and shaping and the critic warm-up."""

from __future__ import annotations

import math

import pytest

from rlsys.config.loader import conf_dir

PRESETS = sorted(p.stem for p in (conf_dir() / "algorithm").glob("*.yaml"))
SMALL = [
    "trainer.total_steps=2",
    "trainer.eval_every=0",
    "eval.num_prompts=16",
    "data.batch_size=4",
    "rollout.n_samples=4",
    "rollout.num_cpus_per_worker=1",
    "learner.world_size=1",  # the presets' losses and sampling are the subject, not sharding
    "task.reward=digit_fraction",
]
# What each preset must show in its step metrics besides the common ones.
EXPECTED = {
    "ppo": ["critic/loss", "critic/values", "time/critic_train", "train/kl_coef"],
    "remax": ["rollout/baseline_reward"],
    "dapo": ["rollout/sampling_rounds", "rollout/groups_filtered"],
    "reinforce_pp": ["train/kl_coef", "time/reference"],
    "reinforce_pp_baseline": ["train/kl_ref", "time/reference"],
    "gspo": ["train/clip_frac"],
    "cispo": ["train/clip_frac"],
    "gmpo": ["train/clip_frac"],
    "clip_cov": ["train/clip_frac", "train/cov_selected"],
    "kl_cov": ["train/cov_selected"],
    "dppo_tv": ["train/clip_frac"],
    "dppo_kl": ["train/clip_frac"],
}


DOCUMENTED = [
    "ppo",
    "grpo",
    "dr_grpo",
    "dapo",
    "gspo",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "remax",
    "cispo",
    "gmpo",
    "sapo",
    "clip_cov",
    "kl_cov",
    "dppo_tv",
    "dppo_kl",
    "dro",
    "gpg",
    "opo",
    "pass_at_k",
    "gigpo",
]


def test_every_documented_preset_exists():
    assert sorted(DOCUMENTED) == PRESETS


# CI runs one preset of each shape of run (policy only, critic, reference, greedy baseline,
# dynamic sampling); presets that differ from these only in their loss or advantage function
# (unit-tested in tests/unit/test_algorithms.py) run in the long tier.
LOSS_VARIANTS = {
    "dr_grpo",
    "gspo",
    "rloo",
    "reinforce_pp_baseline",
    "cispo",
    "gmpo",
    "sapo",
    "clip_cov",
    "kl_cov",
    "dppo_tv",
    "dppo_kl",
    "dro",
    "gpg",
    "opo",
    "pass_at_k",
    "gigpo",
}
# Overrides a preset needs under SMALL: pass@k needs k below SMALL's 4 samples per prompt, and
# rewards that pass (> 0.5): the untrained model's digit_fraction never does, so every group
# would fail alike; "the reply holds a digit" passes about a third of its replies.
EXTRA = {
    "pass_at_k": [
        "algorithm.pass_k=2",
        "task.reward=format",
        "reward.format_pattern='.*[0-9].*'",
    ],
    # gigpo groups the turns of multi-turn trajectories, so it needs a multi-turn task; SMALL's
    # dense reward scores the whole transcript (the untrained model rarely earns the env's)
    "gigpo": ["task=calculator_tool"],
}


# Also long: grpo, the default algorithm every other end-to-end run trains with, and dapo,
# which the four dapo tests below run end to end with their own checks.
COVERED_ELSEWHERE = {"grpo", "dapo"}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(p, marks=pytest.mark.long) if p in LOSS_VARIANTS | COVERED_ELSEWHERE else p
        for p in PRESETS
    ],
)
def test_preset_trains_end_to_end(name, run_controller):
    summary, steps = run_controller(SMALL + [f"algorithm={name}", *EXTRA.get(name, [])])
    assert summary["steps"] == 2 and len(steps) == 2
    assert summary["policy_version"] == 2  # both steps trained and synced
    for record in steps:
        for key in ["train/loss", "train/grad_norm", "train/entropy", *EXPECTED.get(name, [])]:
            assert key in record and math.isfinite(record[key]), (name, key)
    assert any(r["train/grad_norm"] > 0 for r in steps), "no step moved the policy"
    assert 0.0 <= summary["eval_accuracy_after"] <= 1.0


def test_dapo_gives_up_after_max_sampling_rounds(run_controller):
    # An exact-match reward on the untrained model: every group ties at 0, so dynamic sampling
    # spends all its rounds, drops every group and trains on nothing.
    summary, steps = run_controller(
        SMALL
        + [
            "algorithm=dapo",
            "task.reward=exact_match",
            "algorithm.overlong_buffer_frac=0",
            "algorithm.max_sampling_rounds=3",
        ]
    )
    for record in steps:
        assert record["rollout/sampling_rounds"] == 3
        assert record["rollout/groups_filtered"] == 3 * 4  # 3 rounds x data.batch_size
        assert record["buffer/groups_kept"] == 0
    assert summary["policy_version"] == 0


def test_dapo_filters_on_the_verifier_not_the_length_penalty(run_controller):
    # Same all-wrong replies with a budget of 8 tokens, so a 1-token overlong buffer (0.2 x 8
    # rounded down): replies that hit the budget lose 1 and groups' shaped rewards differ, but
    # DAPO keeps groups by their verifier rewards, which still all tie.
    summary, steps = run_controller(
        SMALL
        + [
            "algorithm=dapo",
            "task.reward=exact_match",
            "task.max_new_tokens=8",
            "algorithm.max_sampling_rounds=2",
        ]
    )
    for record in steps:
        assert -1.0 <= record["rollout/overlong_penalty"] < 0
        assert record["rollout/reward_mean"] == pytest.approx(record["rollout/overlong_penalty"])
        assert record["rollout/groups_filtered"] == 2 * 4
    assert summary["policy_version"] == 0


def test_dapo_overlong_punishment_reaches_the_trained_rewards(run_controller):
    summary, steps = run_controller(SMALL + ["algorithm=dapo", "task.max_new_tokens=8"])
    for record in steps:
        assert -1.0 <= record["rollout/overlong_penalty"] < 0
        assert record["buffer/groups_kept"] > 0
    assert summary["policy_version"] == 2


def test_dapo_stops_sampling_once_the_batch_is_full(run_controller):
    _, steps = run_controller(SMALL + ["algorithm=dapo", "algorithm.overlong_filter=true"])
    for record in steps:
        assert record["buffer/groups_kept"] == 4
        assert 1 <= record["rollout/sampling_rounds"] <= 4


def test_critic_pretrain_steps_leave_the_policy_alone(run_controller):
    summary, steps = run_controller(
        SMALL + ["algorithm=ppo", "critic.pretrain_steps=1", "algorithm.kl_target=0.1"]
    )
    assert "train/loss" not in steps[0] and "critic/loss" in steps[0]
    assert "train/loss" in steps[1]
    assert summary["policy_version"] == 1
    assert steps[0]["critic/grad_norm"] > 0  # the critic learns from step 1
