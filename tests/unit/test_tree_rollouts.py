"""Tree rollouts (TreePO) on hand examples: how a tree is grown round by round with a scripted
engine, how leaves carry their shared prefix's tokens and logprobs, the token savings, the
tree advantages and the config checks."""

from __future__ import annotations

import numpy as np
import pytest

from rlsys.algorithms.advantages import grpo_advantages, treepo_advantages, treerl_advantages
from rlsys.algorithms.estimators import ADVANTAGES, AdvantageInputs, GroupNormSettings
from rlsys.algorithms.traits import uses_tree
from rlsys.config.errors import ConfigError
from rlsys.config.tree import TreeConfig
from rlsys.pipeline.tree import generated_tokens, sample_tree, split_quota, tree_segments
from rlsys.resolve import load_config
from rlsys.trainers.rl.sample_metrics import tree_metrics
from rlsys.types import Completion, Prompt, RolloutGroup, Sample, SamplingParams

EOS = 2
CENTRED = GroupNormSettings(normalize_std=False)  # the estimators' settings: r - mean


class ScriptedEngine:
    """Emits token ids 100, 101, ... (a counter over the whole run, so every token generated
    is distinct) with logprob -token/1000, each row up to its budget; a row ends with EOS
    ("stop") after ``stop_after[k]`` tokens if its call-row number k (counted over the run)
    is in ``stop_after``. Records every call's prompts and budgets."""

    def __init__(self, stop_after: dict[int, int] | None = None) -> None:
        self.next_token = 100
        self.rows = 0
        self.stop_after = stop_after or {}
        self.calls: list[tuple[list[list[int]], list[int]]] = []

    def __call__(self, prompts, sampling, budgets):
        assert sampling.n == 1
        self.calls.append((prompts, budgets))
        out = []
        for budget in budgets:
            stop = self.stop_after.get(self.rows)
            self.rows += 1
            if stop is not None and stop <= budget:
                ids = list(range(self.next_token, self.next_token + stop - 1)) + [EOS]
                reason = "stop"
            else:
                ids = list(range(self.next_token, self.next_token + budget))
                reason = "length"
            self.next_token += len(ids)
            out.append([Completion(ids, [-t / 1000 for t in ids], reason, version=3)])
        return out


def _tree(branching=2, segment=2):
    return TreeConfig(enabled=True, branching=branching, segment_tokens=segment)


def test_split_quota():
    assert split_quota(8, 2) == [4, 4]
    assert split_quota(3, 2) == [2, 1]
    assert split_quota(5, 3) == [2, 2, 1]
    assert split_quota(1, 4) == [1]


def test_a_full_binary_tree_shares_its_segments():
    engine = ScriptedEngine()
    prompt = [7, 8]
    (group,) = sample_tree([prompt], SamplingParams(n=4, max_new_tokens=5), _tree(), engine)
    # round 1: the root's 2 children (2 leaves each) generate one segment from the prompt;
    # round 2: 4 children of one leaf each continue their parent's path to the limit
    assert engine.calls[0] == ([prompt, prompt], [2, 2])
    assert engine.calls[1] == (
        [prompt + [100, 101]] * 2 + [prompt + [102, 103]] * 2,
        [3, 3, 3, 3],
    )
    assert len(engine.calls) == 2
    assert [c.token_ids for c in group] == [
        [100, 101, 104, 105, 106],
        [100, 101, 107, 108, 109],
        [102, 103, 110, 111, 112],
        [102, 103, 113, 114, 115],
    ]
    for c in group:  # the shared prefix's logprobs are copied into every leaf
        assert c.logprobs == [-t / 1000 for t in c.token_ids]
        assert c.finish_reason == "length" and c.version == 3 and c.token_versions is None
    assert [c.segments for c in group] == [
        [(1, 2), (3, 3)],
        [(1, 2), (4, 3)],
        [(2, 2), (5, 3)],
        [(2, 2), (6, 3)],
    ]
    samples = [Sample(Prompt(0, "q", "a"), prompt, c, "") for c in group]
    g = RolloutGroup(samples[0].prompt, samples)
    # 2 x 2 shared tokens + 4 x 3 own tokens, where 4 flat replies would cost 4 x 5
    assert generated_tokens(g) == 16
    assert tree_metrics([g]) == {"rollout/tokens_saved_frac": pytest.approx(1 - 16 / 20)}
    assert tree_segments([g]) == [
        ((1, 2), (3, 3)),
        ((1, 2), (4, 3)),
        ((2, 2), (5, 3)),
        ((2, 2), (6, 3)),
    ]


def test_a_branch_that_ends_early_is_a_leaf_and_its_parent_branches_again():
    # call row 0 (the root's first child, owing 2 leaves) ends with EOS after 1 token
    engine = ScriptedEngine(stop_after={0: 1})
    (group,) = sample_tree([[5]], SamplingParams(n=4, max_new_tokens=5), _tree(), engine)
    assert engine.calls[0] == ([[5], [5]], [2, 2])
    # round 2: node 2's two children, and a new child of the root for the leaf node 1 owed
    prompts, budgets = engine.calls[1]
    assert sorted(map(tuple, prompts)) == [(5,), (5, 101, 102), (5, 101, 102)]
    assert sorted(budgets) == [3, 3, 5]
    assert len(group) == 4 and len({tuple(c.token_ids) for c in group}) == 4
    early = [c for c in group if c.finish_reason == "stop"]
    assert [c.token_ids for c in early] == [[EOS]] and early[0].segments == [(1, 1)]
    assert sum(len(c.segments) == 1 for c in group) == 2  # the early leaf and the new child


def test_every_prompt_gets_n_leaves_at_any_n():
    engine = ScriptedEngine()
    out = sample_tree(
        [[1], [2, 3]], SamplingParams(n=3, max_new_tokens=4), _tree(segment=1), engine
    )
    assert [len(g) for g in out] == [3, 3]
    for group in out:
        assert all(len(c.token_ids) == 4 for c in group)
        # quotas 2 + 1: two leaves share the first token, the third has its own
        firsts = sorted(c.token_ids[0] for c in group)
        assert firsts[0] == firsts[1] != firsts[2]


def test_segments_never_pass_the_reply_limit():
    engine = ScriptedEngine()
    (group,) = sample_tree([[1]], SamplingParams(n=8, max_new_tokens=3), _tree(segment=2), engine)
    assert len(group) == 8
    assert all(len(c.token_ids) <= 3 for c in group)
    # the depth-2 nodes reach the limit owing 2 leaves each: each is one leaf, and its parent
    # branches again for the other (1 token left)
    assert all(b <= 3 for _, budgets in engine.calls for b in budgets)


def test_versions_differ_only_where_segments_did():
    class Versioned(ScriptedEngine):
        def __call__(self, prompts, sampling, budgets):
            out = super().__call__(prompts, sampling, budgets)
            version = len(self.calls)  # a weight update between rounds
            return [[Completion(c.token_ids, c.logprobs, c.finish_reason, version)] for (c,) in out]

    (group,) = sample_tree([[1]], SamplingParams(n=2, max_new_tokens=4), _tree(), Versioned())
    # n=2: the root's children own one leaf each and generate in one round
    assert all(c.version == 1 and c.token_versions is None for c in group)
    (group,) = sample_tree([[1]], SamplingParams(n=4, max_new_tokens=4), _tree(), Versioned())
    assert all(c.version == 1 and c.token_versions == [1, 1, 2, 2] for c in group)


def test_a_run_that_ends_returns_none():
    assert sample_tree([[1]], SamplingParams(n=4), _tree(), lambda *a: None) is None


def test_treepo_advantages_by_hand():
    paths = [(1, 3), (1, 4), (2, 5), (2, 6)]
    rewards = [1.0, 0.0, 1.0, 1.0]
    # root: centred [.25, -.75, .25, .25]; node 1: [.5, -.5]; node 2 ties: [0, 0]
    np.testing.assert_allclose(
        treepo_advantages(rewards, paths, normalize_std=False), [0.375, -0.625, 0.125, 0.125]
    )
    # with std: root std 0.5 -> [.5, -1.5, .5, .5]; node 1 std sqrt(.5) -> [+-0.7071]
    s = 0.5**0.5
    np.testing.assert_allclose(
        treepo_advantages(rewards, paths),
        [(0.5 + s) / 2, (-1.5 - s) / 2, 0.25, 0.25],
        atol=1e-5,
    )


def test_treepo_on_a_flat_group_is_grpo_and_ignores_single_leaf_nodes():
    rewards = np.array([0.0, 1.0, 1.0, 0.5])
    flat = treepo_advantages(rewards, [(1,), (2,), (3,), (4,)])
    np.testing.assert_allclose(flat, grpo_advantages(rewards[None])[0], atol=1e-6)
    np.testing.assert_allclose(treepo_advantages(rewards, [()] * 4), flat)


def test_treepo_estimator_handles_each_group_and_broadcasts_over_tokens():
    rewards = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0], np.float32)
    segments = [((1, 1), (3, 2)), ((1, 1), (4, 2)), ((2, 1), (5, 2)), ((2, 1), (6, 2))] * 2
    mask = np.ones((8, 3), np.float32)
    mask[0, 2] = 0
    out = ADVANTAGES.get("treepo")(
        AdvantageInputs(rewards, mask, 4, tree_segments=segments), CENTRED
    ).advantages
    np.testing.assert_allclose(out[:4, 0], [0.375, -0.625, 0.125, 0.125])
    # group 2: root centred [-.25, -.25, .75, -.25]; node 1 ties; node 2 [.5, -.5]
    np.testing.assert_allclose(out[4:, 1], [-0.125, -0.125, 0.625, -0.375])
    assert out[0, 2] == 0.0 and out[0, 1] == out[0, 0]


def test_treerl_advantages_by_hand():
    paths = [(1, 3), (1, 4), (2, 5), (2, 6)]
    rewards = [1.0, 0.0, 1.0, 1.0]
    # V: root .75, node 1 .5, node 2 1; a segment gets (2 V(v) - V(root) - V(parent)) / (2 sqrt L)
    # node 1: (1 - 1.5) / (2 sqrt 2); node 2: (2 - 1.5) / (2 sqrt 2); leaf 3 under node 1:
    # (2 - .75 - .5) / 2 = .375, leaf 4: (0 - 1.25) / 2; leaves 5, 6: (2 - .75 - 1) / 2 = .125
    c = 0.5 / (2 * 2**0.5)
    got = treerl_advantages(rewards, paths, normalize_std=False)
    want = [[-c, 0.375], [-c, -0.625], [c, 0.125], [c, 0.125]]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-6)
    # with std: everything over the group's std (0.5)
    for g, w in zip(treerl_advantages(rewards, paths), want, strict=True):
        np.testing.assert_allclose(g, np.array(w) / 0.5, atol=1e-5)


def test_treerl_on_a_flat_group_is_grpo_and_a_tied_group_gets_nothing():
    rewards = np.array([0.0, 1.0, 1.0, 0.5])
    for paths in ([(1,), (2,), (3,), (4,)], [()] * 4):
        flat = np.concatenate(treerl_advantages(rewards, paths))
        np.testing.assert_allclose(flat, grpo_advantages(rewards[None])[0], atol=1e-5)
    tied = treerl_advantages(np.ones(4), [(1, 3), (1, 4), (2, 5), (2, 6)])
    assert all(np.all(a == 0) for a in tied)


def test_treerl_counts_leaves_not_children_on_an_unbalanced_tree():
    # node 1 holds leaves 0-2 (node 3 holds 0 and 1), node 2 holds leaf 3 alone
    paths = [(1, 3, 5), (1, 3, 6), (1, 4), (2,)]
    rewards = [1.0, 1.0, 0.0, 0.0]
    root, v1, v3 = 0.5, 2 / 3, 1.0
    got = treerl_advantages(rewards, paths, normalize_std=False)
    node1 = (2 * v1 - root - root) / (2 * 3**0.5)  # 3 leaves below it, 2 children
    node3 = (2 * v3 - root - v1) / (2 * 2**0.5)
    np.testing.assert_allclose(got[0], [node1, node3, (2 - root - v3) / 2], atol=1e-6)
    np.testing.assert_allclose(got[2], [node1, (0 - root - v1) / 2], atol=1e-6)
    np.testing.assert_allclose(got[3], [(0 - 2 * root) / 2], atol=1e-6)


def test_treerl_estimator_puts_each_segment_on_its_own_tokens():
    rewards = np.array([1.0, 0.0, 1.0, 1.0], np.float32)
    # a shared segment of 1 token, then own segments of 2 and (row 1, ended early) 1 token
    segments = [((1, 1), (3, 2)), ((1, 1), (4, 1)), ((2, 1), (5, 2)), ((2, 1), (6, 2))]
    mask = np.zeros((4, 5), np.float32)
    mask[:, 2:5] = 1  # the reply starts after two prompt columns
    mask[1, 4] = 0
    out = ADVANTAGES.get("treerl")(
        AdvantageInputs(rewards, mask, 4, tree_segments=segments), CENTRED
    ).advantages
    c = 0.5 / (2 * 2**0.5)
    np.testing.assert_allclose(out[0], [0, 0, -c, 0.375, 0.375], atol=1e-6)
    np.testing.assert_allclose(out[1], [0, 0, -c, -0.625, 0], atol=1e-6)
    np.testing.assert_allclose(out[2], [0, 0, c, 0.125, 0.125], atol=1e-6)
    # a second group, its rows at offsets 4-7; the last row has no segments (one segment)
    both = ADVANTAGES.get("treerl")(
        AdvantageInputs(
            np.concatenate([rewards, [0.0, 1.0, 1.0, 0.0]]).astype(np.float32),
            np.concatenate([mask, mask]),
            4,
            tree_segments=segments + [((7, 1), (9, 2)), ((7, 1), (10, 2)), ((8, 3),), ()],
        ),
        CENTRED,
    ).advantages
    np.testing.assert_allclose(both[:4], out, atol=1e-6)
    # root .5; node 7 (rows 4, 5) .5: its segment 0, leaves (2 r - .5 - .5) / 2
    np.testing.assert_allclose(both[4], [0, 0, 0, -0.5, -0.5], atol=1e-6)
    np.testing.assert_allclose(both[5], [0, 0, 0, 0.5, 0], atol=1e-6)
    np.testing.assert_allclose(both[6], [0, 0, 0.5, 0.5, 0.5], atol=1e-6)
    np.testing.assert_allclose(both[7], [0, 0, -0.5, -0.5, -0.5], atol=1e-6)


def test_tree_config_checks_name_the_keys():
    with pytest.raises(ConfigError, match="rollout.tree.branching"):
        TreeConfig(branching=1)
    with pytest.raises(ConfigError, match="rollout.tree.segment_tokens"):
        TreeConfig(segment_tokens=0)
    with pytest.raises(ConfigError, match="rollout.partial_rollouts"):
        load_config(["rollout.tree.enabled=true", "rollout.partial_rollouts=true"])
    with pytest.raises(ConfigError, match="task.env.name"):
        load_config(["rollout.tree.enabled=true", "task=calculator_tool"])
    with pytest.raises(ConfigError, match="rollout.tree.enabled=false"):
        load_config(["algorithm.advantage=treepo"])
    cfg = load_config(["rollout.tree.enabled=true", "algorithm.advantage=treepo"])
    assert cfg.rollout.tree.enabled and uses_tree(cfg.algorithm)
