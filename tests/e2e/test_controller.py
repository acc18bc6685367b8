"""The controller with real Ray actors for a few steps: metrics, summary, versions, KL."""

from __future__ import annotations

import pytest

# LoRA, one step off-policy: the scoring loop asks the 2 learner ranks for the reference
# (their base model) while the controller trains them, from two driver threads
LORA_ASYNC = ["model.lora.rank=8", "learner.optim.lr=1e-2", "buffer.max_staleness=1"]
# colocated and synchronous: the engines sleep through every step's learner work (on CPU
# their weights go to a file and come back) and wake before the weight sync
ENGINE_SLEEP = ["placement.engine_sleep=true"]


@pytest.mark.parametrize("extra", [ENGINE_SLEEP, LORA_ASYNC], ids=["full-sleep", "lora-async"])
def test_controller_runs_steps_with_reference_kl_and_two_rollout_workers(
    run_controller, tiny_model_dir, extra
):
    from rlsys.models.loading import load_model

    params = load_model(tiny_model_dir).parameters()
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    summary, steps = run_controller(
        [
            "trainer.total_steps=3",
            "trainer.eval_every=2",
            "eval.num_prompts=32",
            "data.batch_size=8",
            "rollout.n_samples=4",
            "rollout.num_workers=2",
            "rollout.num_cpus_per_worker=1",
            "algorithm.kl_coef=0.05",
            "algorithm.filter_uniform_groups=false",
            "learner.world_size=2",
            "task.reward=digit_fraction",
            *extra,
        ]
    )
    assert summary["steps"] == 3 and summary["policy_version"] == 3
    assert summary["samples"] == 3 * 8 * 4
    assert [e["step"] for e in summary["eval_history"]] == [0, 2, 3]
    assert 0.0 <= summary["eval_accuracy_after"] <= 1.0
    assert len(steps) == 3
    for record in steps:
        for key in (
            "rollout/reward_mean",
            "rollout/accuracy",
            "train/kl",
            "train/kl_ref",
            "train/entropy",
            "train/loss",
            "train/grad_norm",
            "rollout/response_tokens",
            "time/generation",
            "time/scoring",
            "time/reference",
            "time/learner_logprobs",
            "time/train",
            "time/weight_sync",
            "perf/tokens_per_s",
            "perf/samples_per_s",
        ):
            assert key in record, key
        # with no filtering every sample is trained on
        assert record["buffer/groups_kept"] == 8
        # engine and learner agree on the behaviour policy's logprobs (samples one version
        # behind are scored by the newer learner); with sleep: the engines woke on the right
        # weights and took the sync
        if extra == ENGINE_SLEEP:
            assert record["train/logprob_mismatch"] < 1e-3
            # each step: both workers slept once (freeing all their weights) and woke once
            assert record["rollout/engines_slept"] == record["rollout/engines_woken"] == 2
            assert record["memory/engine_freed_bytes"] == 2 * weight_bytes
            assert record["time/engine_sleep"] > 0 and record["time/engine_wake"] > 0
            # the hand-over: learners released what they cache, the engines' weights woke,
            # then their KV cache (what a wake takes is measured on a 52 MB model in
            # test_engines: this model's weights fit pages the worker kept)
            assert record["memory/learner_released_bytes"] >= 0
            assert record["memory/learner_resident_bytes"] > 0
            assert "memory/engine_wake_bytes" in record and "time/engine_wake_kv" in record
        else:
            assert "rollout/engines_slept" not in record
    assert steps[-1]["policy/version"] == 3
    # the policy moved away from the reference, and the KL term saw it
    assert steps[-1]["train/kl_ref"] > 0 and steps[-1]["train/grad_norm"] > 0


# two steps of 4 groups of 4 replies, every group trained (tree rollouts' runs below)
TREE_RUN = [
    "trainer.total_steps=2",
    "trainer.eval_every=0",
    "eval.num_prompts=8",
    "data.batch_size=4",
    "rollout.n_samples=4",
    "rollout.num_cpus_per_worker=1",
    "algorithm.filter_uniform_groups=false",
    "task.reward=digit_fraction",
    "learner.world_size=1",  # the test above runs 2 ranks; here the rollouts are the subject
]


def test_iid_tree_rollouts_generate_shared_prefixes_once(run_controller):
    """``rollout.tree.mode=iid`` (HF engine, groups of 4 independent replies; a low
    temperature, so the untrained model's replies share prefixes): the engines generate the
    shared prefixes once, and the learner's log-probabilities of the replies match the
    behaviour logprobs they carry (a shared prefix's, and the branched-off tokens', copied
    from the lead's call)."""
    summary, steps = run_controller(
        [
            *TREE_RUN,
            "rollout.temperature=0.3",
            "rollout.tree.enabled=true",
            "rollout.tree.mode=iid",
        ]
    )
    assert summary["steps"] == 2 and summary["samples"] == 2 * 4 * 4
    assert any(record["rollout/tokens_saved_frac"] > 0 for record in steps)
    for record in steps:
        assert record["train/logprob_mismatch"] < 1e-3


def test_tree_rollouts_train_with_tree_advantages_and_save_tokens(run_controller):
    """Tree rollouts (HF engine, groups of 4 leaves sharing 1-token segments) with TreeRL's
    per-segment advantages (TreePO's run in test_resume): every step's groups cost fewer
    generated tokens than flat ones would, and the learner's log-probabilities of the leaves'
    token ids match the behaviour logprobs they carry (shared prefix logprobs copied into
    each leaf)."""
    summary, steps = run_controller(
        [
            *TREE_RUN,
            "rollout.tree.enabled=true",
            "rollout.tree.branching=2",
            "rollout.tree.segment_tokens=1",
            "algorithm.advantage=treerl",
        ]
    )
    assert summary["steps"] == 2 and summary["samples"] == 2 * 4 * 4
    for record in steps:
        # replies of up to 4 tokens: 2 shared first tokens + 4 own rest, of 4 flat replies
        assert 0.0 < record["rollout/tokens_saved_frac"] < 0.5
        assert record["train/logprob_mismatch"] < 1e-3
        assert record["train/advantage_abs"] > 0
