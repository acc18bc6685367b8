"""Preference losses (Bradley-Terry, DPO / IPO / conservative DPO), their spreading over a
pair's tokens, pair-preserving batch plans, and preference data."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rlsys.algorithms.losses import loss_weights
from rlsys.algorithms.objectives import DPOObjective, RewardModelObjective
from rlsys.algorithms.preference import bradley_terry_loss, dpo_loss, spread_over_pairs
from rlsys.backends.data_parallel import train_plan
from rlsys.config import ConfigError
from rlsys.config.preference import PreferenceDataConfig
from rlsys.data.collate import pack
from rlsys.data.preferences import (
    file_pairs,
    near_miss,
    pair_margins,
    pairwise_accuracy,
    trim_padding,
)
from rlsys.resolve import load_config


def test_bradley_terry_is_the_negative_log_likelihood_of_the_label():
    chosen = torch.tensor([2.0, 0.0, -1.0], requires_grad=True)
    rejected = torch.tensor([1.0, 0.5, -1.0])
    loss, metrics = bradley_terry_loss(chosen, rejected)
    expected = [-math.log(1 / (1 + math.exp(-d))) for d in (1.0, -0.5, 0.0)]
    assert loss.tolist() == pytest.approx(expected, rel=1e-6)
    assert metrics["accuracy"].tolist() == [1.0, 0.0, 0.0]  # a tie is not a win
    assert metrics["margin"].tolist() == [1.0, -0.5, 0.0]
    loss.sum().backward()
    assert (chosen.grad < 0).all()  # descent raises the chosen score


def _logps():
    # policy and reference summed log-probs of 4 pairs (chosen, rejected)
    pc = torch.tensor([-3.0, -5.0, -2.0, -4.0], requires_grad=True)
    pr = torch.tensor([-4.0, -4.0, -6.0, -4.0], requires_grad=True)
    rc = torch.tensor([-3.5, -5.0, -3.0, -4.0])
    rr = torch.tensor([-3.5, -4.5, -5.0, -4.0])
    return pc, pr, rc, rr


def test_dpo_loss_matches_the_paper_formula():
    pc, pr, rc, rr = _logps()
    beta = 0.5
    h = (pc - rc) - (pr - rr)
    loss, metrics = dpo_loss(pc, pr, rc, rr, beta, "dpo")
    assert torch.allclose(loss, -F.logsigmoid(beta * h))
    assert torch.allclose(metrics["reward_chosen"], beta * (pc - rc).detach())
    assert torch.allclose(metrics["reward_rejected"], beta * (pr - rr).detach())
    assert metrics["accuracy"].tolist() == (h > 0).float().tolist()
    # at the reference every pair costs log 2
    same, _ = dpo_loss(rc, rr, rc, rr, beta, "dpo")
    assert torch.allclose(same, torch.full((4,), math.log(2.0)))


def test_conservative_dpo_mixes_both_labels():
    pc, pr, rc, rr = _logps()
    beta, eps = 0.5, 0.2
    h = (pc - rc) - (pr - rr)
    loss, _ = dpo_loss(pc, pr, rc, rr, beta, "cdpo", eps)
    expected = -(1 - eps) * F.logsigmoid(beta * h) - eps * F.logsigmoid(-beta * h)
    assert torch.allclose(loss, expected)
    # e = 0 is DPO; plain DPO ignores label_smoothing
    assert torch.allclose(
        dpo_loss(pc, pr, rc, rr, beta, "cdpo", 0.0)[0], dpo_loss(pc, pr, rc, rr, beta)[0]
    )
    assert torch.allclose(
        dpo_loss(pc, pr, rc, rr, beta, "dpo", 0.3)[0], dpo_loss(pc, pr, rc, rr, beta)[0]
    )
    # with noisy labels the loss is bounded below away from 0: it stops pushing h to infinity
    far, _ = dpo_loss(
        torch.tensor([100.0]),
        torch.tensor([-100.0]),
        torch.zeros(1),
        torch.zeros(1),
        beta,
        "cdpo",
        eps,
    )
    assert far.item() > 10


def test_ipo_regresses_the_gap_to_one_over_two_beta():
    pc, pr, rc, rr = _logps()
    beta = 0.25
    h = (pc - rc) - (pr - rr)
    loss, _ = dpo_loss(pc, pr, rc, rr, beta, "ipo")
    assert torch.allclose(loss, (h - 1 / (2 * beta)) ** 2)
    # the minimum sits at h = 1 / (2 beta) = 2: zero loss and zero gradient there
    chosen = torch.tensor([2.0], requires_grad=True)
    at_target, _ = dpo_loss(chosen, torch.zeros(1), torch.zeros(1), torch.zeros(1), beta, "ipo")
    at_target.sum().backward()
    assert at_target.item() == 0.0 and chosen.grad.item() == 0.0


def test_preference_loss_rejects_bad_arguments():
    pc, pr, rc, rr = _logps()
    with pytest.raises(ValueError, match="dpo.loss='kto'"):
        dpo_loss(pc, pr, rc, rr, 0.1, "kto")
    with pytest.raises(ValueError, match="dpo.beta"):
        dpo_loss(pc, pr, rc, rr, 0.0, "dpo")


def test_rpo_adds_the_chosen_replies_nll_per_token():
    pc, pr, rc, rr = _logps()
    tokens = torch.tensor([3.0, 5.0, 2.0, 4.0])
    plain, _ = dpo_loss(pc, pr, rc, rr, 0.5, "dpo")
    loss, metrics = dpo_loss(pc, pr, rc, rr, 0.5, "dpo", nll_coef=2.0, chosen_tokens=tokens)
    # NLL per token of the chosen side: 3/3, 5/5, 2/2, 4/4 = 1 each, times 2
    assert torch.allclose(loss, plain + 2.0)
    assert metrics["nll_chosen"].tolist() == [1.0, 1.0, 1.0, 1.0]
    # the term's gradient raises every chosen reply's likelihood, 1/|y_w| per unit of a
    loss.sum().backward()
    dpo_grad = torch.autograd.grad(plain.sum(), pc)[0]
    assert torch.allclose(pc.grad - dpo_grad, -2.0 / tokens)
    with pytest.raises(ValueError, match="chosen_tokens"):
        dpo_loss(pc, pr, rc, rr, 0.5, "dpo", nll_coef=1.0)


def test_rpo_objective_counts_each_chosen_rows_tokens():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # one pair: chosen has 2 tokens
    logprobs = torch.tensor([[-1.0, -3.0, -9.0], [-1.0, -1.0, -1.0]])
    batch = {"loss_mask": mask, "ref_logprobs": logprobs.clone()}
    plain, _ = DPOObjective(beta=0.1)({"logprobs": logprobs}, batch)
    loss, metrics = DPOObjective(beta=0.1, nll_coef=1.0)({"logprobs": logprobs}, batch)
    # chosen NLL per token (1 + 3) / 2 = 2 (the padded -9 is not counted)
    assert torch.allclose(loss, plain + 2.0)
    assert float(metrics["nll_chosen"][0, 0]) == pytest.approx(2.0)


def test_spread_pair_losses_weigh_to_the_mean_over_pairs():
    """Rows of different lengths: the weighted token sum is exactly the mean pair loss."""
    mask = torch.zeros(6, 7)
    for row, length in enumerate([1, 5, 3, 3, 6, 2]):
        mask[row, :length] = 1
    per_pair = torch.tensor([0.3, 1.2, 2.5])
    per_token = spread_over_pairs(per_pair, mask)
    weights = loss_weights(mask, "seq_mean_token_mean", float(mask.sum()), 6.0)
    assert float((per_token * weights).sum()) == pytest.approx(float(per_pair.mean()))


def test_pair_objectives_on_model_outputs():
    mask = torch.ones(4, 3)
    scores = torch.tensor([1.0, 0.0, -1.0, 2.0], requires_grad=True)
    loss, metrics = RewardModelObjective()({"scores": scores}, {"loss_mask": mask})
    assert loss.shape == mask.shape
    assert loss[0].tolist() == pytest.approx([-math.log(1 / (1 + math.exp(-1)))] * 3)
    assert metrics["accuracy"][:, 0].tolist() == [1.0, 1.0, 0.0, 0.0]
    logprobs = torch.full((4, 3), -1.0, requires_grad=True)
    batch = {"loss_mask": mask, "ref_logprobs": torch.full((4, 3), -1.0)}
    loss, _ = DPOObjective(beta=0.1)({"logprobs": logprobs}, batch)
    assert torch.allclose(loss, torch.full((4, 3), math.log(2.0)))
    # a rank's dummy row (no rows to train): zero loss that still reaches the model
    one = torch.tensor([0.7], requires_grad=True)
    loss, metrics = RewardModelObjective()({"scores": one}, {"loss_mask": torch.zeros(1, 3)})
    loss.sum().backward()
    assert loss.abs().sum() == 0 and one.grad is not None and metrics == {}


def test_train_plan_keeps_pairs_together():
    mask = np.ones((40, 5), np.float32)
    seen = []
    for rank in range(2):
        for plan in train_plan(mask, 2, rank, num_mini_batches=3, micro=6, seed=1, group=2):
            assert plan.global_seqs > 0
            for rows in plan.micro_batches:
                assert len(rows) % 2 == 0 and len(rows) <= 6
                assert (rows[0::2] % 2 == 0).all() and (rows[1::2] == rows[0::2] + 1).all()
                seen.extend(rows.tolist())
    assert sorted(seen) == list(range(40))  # every row once, over ranks and mini-batches
    with pytest.raises(ValueError, match="groups of 2"):
        train_plan(np.ones((5, 3)), 1, 0, 1, 4, 0, group=2)
    # group=1 is the plan it always was
    one = train_plan(mask, 2, 0, 2, 8, seed=3)
    assert sum(len(r) for p in one for r in p.micro_batches) == 20


def test_near_miss_changes_digits_only():
    rng = np.random.default_rng(0)
    for answer in ["052", "7", "1234", "x=19"]:
        for _ in range(50):
            wrong = near_miss(answer, rng)
            assert wrong != answer and len(wrong) == len(answer)
            assert all(
                a == b or (a.isdigit() and b.isdigit()) for a, b in zip(answer, wrong, strict=True)
            )
            assert 1 <= sum(a != b for a, b in zip(answer, wrong, strict=True)) <= 2
    with pytest.raises(ValueError, match="preference.train_path"):
        near_miss("yes", rng)


def test_file_pairs_skip_malformed_rows_and_hold_out(tmp_path):
    rows = [{"prompt": f"q{i}", "chosen": "good", "rejected": "bad", "id": i} for i in range(20)]
    rows += [{"prompt": "q", "chosen": "same", "rejected": "same"}, {"prompt": "q", "chosen": ""}]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    splits = file_pairs(PreferenceDataConfig(train_path=str(path), eval_size=3), seed=0)
    assert (len(splits.train), len(splits.eval), splits.skipped_rows) == (17, 3, 3)
    assert splits.train[0].prompt.meta["id"] is not None
    with pytest.raises(ConfigError, match="preference.train_path"):
        file_pairs(PreferenceDataConfig(train_path=str(tmp_path / "missing.jsonl")), 0)


def test_trim_padding_keeps_token_alignment():
    batch = pack([[5, 6, 7, 8], [5], [9, 9], [4]], [[1, 2], [3], [1], [2, 2, 2, 2]], pad_id=0)
    part = batch.select(np.array([1, 2]))
    trimmed = trim_padding(part)
    assert trimmed.input_ids.shape[1] < part.input_ids.shape[1]
    for full, cut in ((part, trimmed),):
        # the target of every loss position is the same token before and after trimming
        targets_full = full.input_ids[:, 1:][full.loss_mask > 0]
        targets_cut = cut.input_ids[:, 1:][cut.loss_mask > 0]
        assert targets_full.tolist() == targets_cut.tolist()
    margins = pair_margins(np.array([3.0, 1.0, 0.0, 2.0, 1.0, 1.0]))
    assert margins.tolist() == [2.0, -2.0, 0.0]
    assert pairwise_accuracy(margins) == pytest.approx(0.5)  # right, wrong, a tie (half)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["dpo.loss=dpo", "dpo.label_smoothing=0.1"], "dpo.label_smoothing"),
        (["dpo.loss=cdpo", "dpo.label_smoothing=0.5"], "dpo.label_smoothing"),
        (["dpo.loss=kto"], "dpo.loss"),
        (["dpo.beta=0"], "dpo.beta"),
        (["dpo.nll_coef=-1"], "dpo.nll_coef"),
        (["preference.eval_path=x.jsonl"], "preference.train_path"),
        (["rm.batch_size=0"], "rm.batch_size"),
    ],
)
def test_preference_config_errors_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides)
