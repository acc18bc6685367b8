"""The RLHF example's synthetic preference task (task=reviews), its hidden labeller (the
``sentiment`` reward) and the synthetic pairs made from a policy's scored replies."""

from __future__ import annotations

import numpy as np
import pytest

from rlsys.config import ConfigError
from rlsys.config.preference import PreferenceDataConfig
from rlsys.config.schema import TaskConfig
from rlsys.data.preferences import synthetic_pairs
from rlsys.data.reviews import NEGATIVE, NEUTRAL, NOUNS, POSITIVE, sentiment_score
from rlsys.data.tasks import TaskSplits, load_task
from rlsys.resolve import load_config
from rlsys.rewards.registry import build_reward
from rlsys.rewards.scoring import outcome_of
from rlsys.types import Completion, Prompt, Sample


def _reviews(**kw) -> TaskSplits:
    cfg = TaskConfig(name="reviews", reward="sentiment", reverse_answer=False, **kw)
    return load_task(cfg, seed=0)


def test_labeller_scores_positive_minus_negative_and_rejects_other_forms():
    assert sentiment_score("great and tasty") == 1.0
    assert sentiment_score(" good and old") == 0.5  # surrounding space is fine
    assert sentiment_score("dull and fun") == 0.0
    assert sentiment_score("big and new") == 0.0
    assert sentiment_score("awful and rude") == -1.0
    for bad in [
        "",
        "great",
        "great tasty",
        "great and tasty and fun",
        "great or tasty",
        "gr8 and fun",
    ]:
        assert sentiment_score(bad) == -1.0, bad
    reward = build_reward("sentiment", None)
    good, flat = (
        outcome_of(reward("p", "nice and big", {})),
        outcome_of(reward("p", "big and old", {})),
    )
    assert (good.reward, good.correct) == (0.5, True)
    assert (flat.reward, flat.correct) == (0.0, False)  # the verdict is "positive", score > 0


def test_reviews_task_splits_are_distinct_deterministic_and_of_mixed_sentiment():
    task = _reviews(train_size=1300, eval_size=500)
    again = _reviews(train_size=1300, eval_size=500)
    assert [p.text for p in task.train] == [p.text for p in again.train]
    texts = [p.text for p in task.train + task.eval]
    assert len(set(texts)) == 1800 and all(t.endswith(" ") for t in texts)
    assert set(p.meta["noun"] for p in task.eval) == set(NOUNS)
    assert task.max_new_tokens == 18
    longest = max(len(f"{a} and {b}") for a in POSITIVE + NEGATIVE + NEUTRAL for b in POSITIVE)
    assert longest + 1 <= task.max_new_tokens  # the longest reply and EOS fit
    scores = np.array([sentiment_score(p.answer) for p in task.train])
    lexicon = set(POSITIVE + NEGATIVE + NEUTRAL)
    for p in task.train:  # every demonstration is well formed
        first, conjunction, second = p.answer.split(" ")
        assert conjunction == "and" and {first, second} <= lexicon
    positive = scores > 0
    assert 0.25 < positive.mean() < 0.55  # mixed: SFT leaves room to improve
    lean = {
        n: np.mean([s > 0 for p, s in zip(task.train, scores, strict=True) if p.meta["noun"] == n])
        for n in NOUNS
    }
    assert max(lean.values()) - min(lean.values()) > 0.4  # and it depends on the noun
    with pytest.raises(ValueError, match="task.train_size"):
        _reviews(train_size=1500, eval_size=500)


def _sample(prompt: Prompt, text: str, reward: float, correct: bool = False) -> Sample:
    return Sample(prompt, [], Completion([], [], "stop", 0), text, reward, correct)


def test_ranked_pairs_choose_the_best_scored_reply_and_skip_ties():
    task = TaskSplits([Prompt(i, f"q{i}", "") for i in range(10)], [Prompt(98, "e", "")], 4)
    cfg = PreferenceDataConfig(synthetic="ranked", synthetic_pairs=40, eval_size=4)

    def sample(prompts):
        out = []
        for p in prompts:
            if p.uid % 2:  # every reply scores alike: no pair
                out.append([_sample(p, "a", 0.5), _sample(p, "b", 0.5)])
            else:
                out.append(
                    [_sample(p, "mid", 0.0), _sample(p, "best", 1.0), _sample(p, "worst", -1.0)]
                )
        return out

    splits = synthetic_pairs(task, cfg, seed=0, sample=sample)
    assert splits.train and all(p.prompt.uid % 2 == 0 for p in splits.train)
    assert all((p.chosen, p.rejected) == ("best", "worst") for p in splits.train + splits.eval)
    assert splits.policy_pair_frac == pytest.approx(len(splits.train + splits.eval) / 44)
    with pytest.raises(ValueError, match="preference.samples_per_prompt"):
        synthetic_pairs(task, cfg, 0, lambda ps: [[_sample(p, "a", 0.0)] for p in ps])


def test_mistake_pairs_take_the_policy_mistake_else_a_near_miss():
    task = TaskSplits(
        [Prompt(0, "1+2=", "003"), Prompt(1, "2+2=", "004")], [Prompt(2, "3+3=", "006")], 4
    )
    cfg = PreferenceDataConfig(synthetic="mistakes", synthetic_pairs=20, eval_size=5)

    def sample(prompts):  # prompt 0: a mistake among the replies; others: always right
        return [
            [_sample(p, p.answer, 1.0, True), _sample(p, "013", 0.0)]
            if p.uid == 0
            else [_sample(p, p.answer, 1.0, True)]
            for p in prompts
        ]

    splits = synthetic_pairs(task, cfg, seed=0, sample=sample)
    for pair in splits.train + splits.eval:
        assert pair.chosen == pair.prompt.answer
        if pair.prompt.uid == 0:
            assert pair.rejected == "013"
        else:
            assert pair.rejected != pair.chosen and len(pair.rejected) == 3  # a near miss
    near = synthetic_pairs(task, PreferenceDataConfig(synthetic="near_miss", eval_size=5), 0)
    assert near.policy_pair_frac is None and len(near.train) == 4096


def test_ranked_pairs_need_two_replies_per_prompt():
    with pytest.raises(ConfigError, match="preference.samples_per_prompt"):
        load_config(["preference.synthetic=ranked", "preference.samples_per_prompt=1"])
    with pytest.raises(ConfigError, match="preference.synthetic"):
        load_config(["preference.synthetic=policy"])


def test_rlhf_summary_merges_the_stages_and_prints_its_path_last(tmp_path, capsys):
    import json

    from rlsys.trainers.preference.summary import main, merge

    stages = {
        "sft": {"steps": 150, "eval_accuracy": 0.36, "final_model": "m/sft"},
        "rm": {
            "steps": 200,
            "data": {"train_pairs": 4000, "eval_pairs": 250},
            "eval_pairwise_accuracy_before": 0.5,
            "eval_pairwise_accuracy": 0.96,
            "final_model": "m/rm",
        },
        "ppo": {
            "steps": 40,
            "eval_accuracy_before": 0.35,
            "eval_accuracy_after": 0.99,
            "final_model": "m/ppo",
        },
        "dpo": {
            "steps": 100,
            "eval_accuracy_before": 0.35,
            "eval_accuracy_after": 0.6,
            "eval_pairwise_accuracy_before": 0.5,
            "eval_pairwise_accuracy": 0.8,
            "final_model": "m/dpo",
        },
    }
    paths = {}
    for name, summary in stages.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(summary))
    merged = merge({k: str(v) for k, v in paths.items()})
    assert merged["ppo_gain"] == pytest.approx(0.64) and merged["dpo_gain"] == pytest.approx(0.25)
    assert merged["rm_pairwise_accuracy"] == 0.96 and merged["stages"]["rm"]["train_pairs"] == 4000
    out = tmp_path / "summary.json"
    assert main([str(out), *(f"{k}={v}" for k, v in paths.items())]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"summary: {out}"
    assert json.loads(out.read_text()) == merged
    with pytest.raises(ValueError, match=r"\['dpo'\]"):
        merge({k: str(v) for k, v in paths.items() if k != "dpo"})
    paths["rm"].unlink()
    with pytest.raises(FileNotFoundError, match="stage rm"):
        merge({k: str(v) for k, v in paths.items()})
