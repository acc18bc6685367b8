"""``reward.by_source``: each row scored by the reward its verl ``data_source`` names, other
rows by ``task.reward``; bad routes refused with the key at fault."""

from __future__ import annotations

import pytest

from rlsys.config.errors import ConfigError
from rlsys.config.reward import RewardConfig
from rlsys.rewards.scorer import RewardScorer

GSM8K_STYLE = "so 3+4 = 7\n#### 7 apples, of 9"  # gsm8k reads 7 (after ####); last_number 9


def _items(source: str | None) -> list:
    meta = {"answer": "7"} if source is None else {"answer": "7", "data_source": source}
    return [("3+4?", GSM8K_STYLE, meta), ("3+4?", "it is 7", dict(meta))]


def test_rows_go_to_the_reward_their_source_names():
    cfg = RewardConfig(by_source={"openai/gsm8k": "gsm8k", "plain": "exact_match"})
    scorer = RewardScorer.from_config("last_number", cfg)
    routed = scorer.score(_items("openai/gsm8k"))
    assert [o.reward for o in routed] == [1.0, 1.0]  # gsm8k: 7 after ####; 7 the last number
    exact = scorer.score(_items("plain"))
    assert [o.reward for o in exact] == [0.0, 0.0]  # neither reply is exactly "7"
    # no data_source, or one not listed: task.reward (last_number: 9 then 7)
    for items in (_items(None), _items("elsewhere")):
        assert [o.reward for o in scorer.score(items)] == [0.0, 1.0]
    # the verdict follows the routed reward too, and its metric keeps the verifier's name
    assert [o.correct for o in routed] == [True, True]
    assert set(routed[0].components) == {"last_number"}


def test_a_batch_may_mix_sources():
    scorer = RewardScorer.from_config("last_number", RewardConfig(by_source={"g": "gsm8k"}))
    items = _items("g")[:1] + _items(None)[:1]
    assert [o.reward for o in scorer.score(items)] == [1.0, 0.0]


def test_an_unknown_reward_is_refused_naming_the_source_key():
    with pytest.raises(ConfigError, match=r"reward\.by_source\.openai/gsm8k"):
        RewardScorer.from_config("last_number", RewardConfig(by_source={"openai/gsm8k": "gsmk"}))


@pytest.mark.parametrize("other", [{"url": "http://127.0.0.1:1/score"}, {"fn": "r.py:f"}])
def test_by_source_with_a_replaced_verifier_is_refused(other):
    with pytest.raises(ConfigError, match="reward.by_source and reward"):
        RewardConfig(by_source={"a": "gsm8k"}, **other)
