"""Tree rollouts of independent replies (``rollout.tree.mode=iid``) on a policy known exactly:
the replies are distributed as flat ones (each reply's law, and how often two replies of a
group are equal), the engines generate each distinct prefix once, a hand example's tree,
replies that branch off onto an end token, the end tokens and the config checks."""

from __future__ import annotations

import json
import math
from itertools import chain, combinations, repeat
from types import SimpleNamespace

import numpy as np
import pytest

from rlsys.algorithms.traits import uses_tree
from rlsys.config.errors import ConfigError
from rlsys.config.tree import TreeConfig
from rlsys.models.loading import end_token_ids
from rlsys.pipeline.iid_tree import draw, sample_iid_tree
from rlsys.pipeline.tree import generated_tokens
from rlsys.resolve import load_config
from rlsys.types import Completion, Prompt, RolloutGroup, Sample, SamplingParams

EOS = 2
# next-token probabilities given the previous token (None: the reply's first)
POLICY = {
    None: {3: 0.5, 4: 0.3, 5: 0.15, EOS: 0.05},
    3: {3: 0.6, 4: 0.2, EOS: 0.2},
    4: {5: 0.7, EOS: 0.3},
    5: {EOS: 0.5, 3: 0.5},
}
LIMIT = 4


class PolicyEngine:
    """Samples ``POLICY`` (the prompt's last token is ignored), reporting every token of the
    distribution at each position; counts the tokens it generates."""

    def __init__(self, seed: int, top: bool = True) -> None:
        self.rng = np.random.default_rng(seed)
        self.top = top
        self.generated = 0

    def __call__(self, prompts, sampling, budgets):
        assert sampling.n == 1 and sampling.top_logprobs > 0
        out = []
        for prompt, budget in zip(prompts, budgets, strict=True):
            reply = prompt[1:]  # the prompt is [1]: what follows is the reply so far
            tokens, logprobs, tops = [], [], []
            last = reply[-1] if reply else None
            while len(tokens) < budget:
                dist = POLICY[last]
                last = int(self.rng.choice(list(dist), p=list(dist.values())))
                tokens.append(last)
                logprobs.append(math.log(dist[last]))
                tops.append(
                    sorted(((t, math.log(p)) for t, p in dist.items()), key=lambda x: -x[1])
                )
                if last == EOS:
                    break
            self.generated += len(tokens)
            reason = "stop" if tokens[-1] == EOS else "length"
            out.append(
                [Completion(tokens, logprobs, reason, 0, top_logprobs=tops if self.top else None)]
            )
        return out


def _exact_replies() -> dict[tuple[int, ...], float]:
    """Every reply of at most LIMIT tokens with its probability under POLICY."""
    law: dict[tuple[int, ...], float] = {}

    def grow(reply: tuple[int, ...], p: float) -> None:
        if (reply and reply[-1] == EOS) or len(reply) == LIMIT:
            law[reply] = p
            return
        for token, q in POLICY[reply[-1] if reply else None].items():
            grow((*reply, token), p * q)

    grow((), 1.0)
    return law


def _sample(c: Completion) -> Sample:
    return Sample(Prompt(0, "", ""), [], c, "")


def test_draw_renormalizes_the_reported_tokens():
    top = [(5, math.log(0.25)), (6, math.log(0.75))]
    assert draw(top, 0.2)[0] == 5 and draw(top, 0.3)[0] == 6
    half = [(5, math.log(0.1)), (6, math.log(0.4))]  # half the mass reported
    assert draw(half, 0.19) == half[0] and draw(half, 0.21) == half[1]
    assert draw(half, 0.999999)[0] == 6


def _chi2_critical(df: int, z: float = 3.719) -> float:
    """The chi-square value exceeded with probability 1e-4 (z: the normal's 1e-4 quantile)
    at ``df`` degrees of freedom, by Wilson and Hilferty's approximation."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_replies_are_distributed_as_independent_draws():
    """Over 6000 groups of 4: the replies' frequencies fit their probabilities (a chi-square
    test at p = 1e-4, pooling replies expected fewer than 20 times), two replies of a group
    are equal as often as independent draws are (a sampler that made followers branch, or
    copy, would miss either), and each slot of a group holds any reply as often (the leaves
    are shuffled out of their tree order, where the lead's copies come first)."""
    engine = PolicyEngine(seed=0)
    groups = sample_iid_tree(
        [[1]] * 6000,
        SamplingParams(n=4, max_new_tokens=LIMIT),
        8,
        {EOS},
        engine,
        np.random.default_rng(1).random,
    )
    law = _exact_replies()
    replies = [tuple(c.token_ids) for g in groups for c in g]
    counts: dict[tuple[int, ...], int] = {}
    for r in replies:
        counts[r] = counts.get(r, 0) + 1
    assert set(counts) <= set(law)
    cells = [r for r in law if law[r] * len(replies) >= 20]
    observed = [counts.get(r, 0) for r in cells] + [
        len(replies) - sum(counts.get(r, 0) for r in cells)
    ]
    expected = [law[r] * len(replies) for r in cells] + [
        (1 - sum(law[r] for r in cells)) * len(replies)
    ]
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    assert chi2 < _chi2_critical(len(observed) - 1), chi2
    equal = np.mean([a.token_ids == b.token_ids for g in groups for a, b in combinations(g, 2)])
    assert equal == pytest.approx(sum(p * p for p in law.values()), abs=0.01)
    first_is_3 = np.mean([[c.token_ids[0] == 3 for c in g] for g in groups], axis=0)
    np.testing.assert_allclose(first_is_3, POLICY[None][3], atol=0.03)
    for c in (c for g in groups for c in g):  # logprobs: the policy's, shared ones too
        previous = [None, *c.token_ids[:-1]]
        want = [math.log(POLICY[prev][t]) for prev, t in zip(previous, c.token_ids, strict=True)]
        np.testing.assert_allclose(c.logprobs, want)
        assert c.finish_reason == ("stop" if c.token_ids[-1] == EOS else "length")
    # the engine generated each group's distinct prefixes once (plus the tokens followers
    # branched off onto, which it reported but did not sample), and the accounting says so
    tries = [
        {tuple(c.token_ids[:k]) for c in g for k in range(1, len(c.token_ids) + 1)} for g in groups
    ]
    made = [generated_tokens(RolloutGroup(None, [_sample(c) for c in g])) for g in groups]
    assert made == [len(t) for t in tries]
    assert engine.generated < sum(made) < sum(len(r) for r in replies)


class Scripted:
    """Replies from a table: prefix after the prompt -> (tokens, per-position top); logprob
    -0.1 x token; the policy version is the call's number (a weight update between rounds)."""

    def __init__(self, table):
        self.table = table
        self.calls = []

    def __call__(self, prompts, sampling, budgets):
        self.calls.append(([p[1:] for p in prompts], budgets))
        out = []
        for p in prompts:
            tokens, top = self.table[tuple(p[1:])]
            reason = "stop" if tokens[-1] == EOS else "length"
            logprobs = [-0.1 * t for t in tokens]
            version = len(self.calls)
            out.append([Completion(tokens, logprobs, reason, version, top_logprobs=top)])
        return out


def _scripted(*values: float):
    """The given uniforms, then 0.5 for ever (the leaves' shuffle)."""
    return chain(values, repeat(0.5)).__next__


HALF = [(3, math.log(0.5)), (4, math.log(0.5))]


def test_a_follower_branches_off_where_it_draws_another_token():
    """n=3: the lead is 3 3 EOS; follower 1 draws 3 then 4 (branches off at position 1),
    follower 2 draws the lead's tokens throughout (a copy). The lead is cut where follower
    1 left it; the next round generates follower 1's reply from 3 4."""
    engine = Scripted(
        {(): ([3, 3, EOS], [HALF, HALF, [(EOS, 0.0)]]), (3, 4): ([EOS], [[(EOS, 0.0)]])}
    )
    uniforms = _scripted(0.1, 0.9, 0.1, 0.1, 0.1)
    (group,) = sample_iid_tree(
        [[1]], SamplingParams(n=3, max_new_tokens=5), 2, {EOS}, engine, uniforms
    )
    group = sorted(group, key=lambda c: c.segments)
    assert engine.calls == [([[]], [5]), ([[3, 4]], [3])]
    assert [c.token_ids for c in group] == [[3, 3, EOS], [3, 3, EOS], [3, 4, EOS]]
    assert [c.segments for c in group] == [[(1, 1), (2, 2)], [(1, 1), (2, 2)], [(1, 1), (3, 2)]]
    # the branched-off token keeps its reported logprob; the rest, the engine's
    np.testing.assert_allclose(group[2].logprobs, [-0.3, math.log(0.5), -0.2])
    assert generated_tokens(RolloutGroup(None, [_sample(c) for c in group])) == 5
    # versions: the lead's call was 1, the branch's 2; the branched-off token came from call
    # 1's distribution
    assert group[0].version == 1 and group[0].token_versions is None
    assert group[2].version == 1 and group[2].token_versions == [1, 1, 2]


def test_a_follower_that_branches_off_onto_an_end_ends_there():
    """Onto EOS: a reply that ends at once ("stop", no engine call); at the token limit:
    "length"."""
    top = [[(3, math.log(0.5)), (EOS, math.log(0.5))], [(3, math.log(0.5)), (4, math.log(0.5))]]
    engine = Scripted({(): ([3, 3], top)})
    uniforms = _scripted(0.9, 0.1, 0.9)  # follower 1: EOS at 0; follower 2: 3, then 4 at 1
    (group,) = sample_iid_tree(
        [[1]], SamplingParams(n=3, max_new_tokens=2), 2, {EOS}, engine, uniforms
    )
    assert len(engine.calls) == 1
    assert sorted((c.token_ids, c.finish_reason) for c in group) == [
        ([2], "stop"),
        ([3, 3], "length"),
        ([3, 4], "length"),
    ]


def test_an_engine_without_top_logprobs_is_refused():
    with pytest.raises(RuntimeError, match="rollout.tree.mode"):
        sample_iid_tree(
            [[1]],
            SamplingParams(n=2, max_new_tokens=3),
            4,
            {EOS},
            PolicyEngine(0, top=False),
            lambda: 0.5,
        )


def test_a_run_that_ends_returns_none():
    out = sample_iid_tree(
        [[1]], SamplingParams(n=2, max_new_tokens=3), 4, {EOS}, lambda *a: None, lambda: 0.5
    )
    assert out is None


def test_iid_config_checks_name_the_keys():
    with pytest.raises(ConfigError, match="rollout.tree.mode"):
        TreeConfig(mode="entropy")
    with pytest.raises(ConfigError, match="rollout.tree.top_logprobs"):
        TreeConfig(top_logprobs=0)
    with pytest.raises(ConfigError, match="rollout.stop_token_ids"):
        load_config(["rollout.tree.enabled=true", "rollout.tree.mode=iid", "rollout.stop=[';']"])
    cfg = load_config(["rollout.tree.enabled=true", "rollout.tree.mode=iid"])
    assert cfg.rollout.tree.mode == "iid" and not uses_tree(cfg.algorithm)


def test_end_tokens_are_the_tokenizers_and_the_models(tmp_path):
    """A reply that branches off onto any id the engines stop on ends there: the tokenizer's
    EOS, the model config's (an id or a list) and the generation config's."""
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 9}))
    assert end_token_ids(str(tmp_path), SimpleNamespace(eos_token_id=2)) == {2, 7, 8, 9}
    assert end_token_ids(str(tmp_path / "absent"), SimpleNamespace(eos_token_id=2)) == {2}
