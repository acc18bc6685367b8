"""The names the algorithm config accepts, in one torch-free place: the schema validates
against these and the implementations register under them."""

from __future__ import annotations

ADVANTAGE_ESTIMATORS = (
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "remax",
    "gae",
)
# Estimators that compare the samples of a prompt (need rollout.n_samples >= 2).
GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")
NEEDS_CRITIC = ("gae",)  # estimators that start a critic pool
NEEDS_GREEDY_BASELINE = ("remax",)  # estimators that generate one greedy reply per prompt
POLICY_LOSSES = ("ppo_clip", "gspo", "vanilla")
LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_sum_norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
KL_PENALTIES = ("loss", "reward")
OFF_POLICY_CORRECTIONS = ("none", "tis", "decoupled")
PREFERENCE_LOSSES = ("dpo", "ipo", "cdpo")  # dpo.loss
