"""GiGPO: per-turn records of multi-turn rollouts (spans, rewards, anchor-state keys), the
step-grouped advantage on hand-computed examples, its estimator's token layout, the step-group
metrics and the config check that it needs a multi-turn task."""

from __future__ import annotations

import numpy as np
import pytest
from test_envs import ScriptedEngine

from rlsys.algorithms.advantages import gigpo_advantages, grpo_advantages
from rlsys.algorithms.estimators import (
    ADVANTAGES,
    AdvantageInputs,
    GigpoSettings,
    GroupNormSettings,
)
from rlsys.algorithms.traits import uses_turns
from rlsys.checkpoint.state_file import read_state, write_state
from rlsys.config.env import EnvConfig
from rlsys.config.errors import ConfigError
from rlsys.data.collate import batch_turns, samples_to_batch
from rlsys.envs import EpisodeRunner, StepResult
from rlsys.envs.calculator import Calculator
from rlsys.models.loading import load_tokenizer
from rlsys.resolve import load_config
from rlsys.trainers.rl.sample_metrics import step_group_metrics
from rlsys.types import Completion, Prompt, RolloutGroup, Sample, SamplingParams, Turn


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


# ---- the pure function ---------------------------------------------------------------------


def test_turns_on_equal_states_form_step_groups_and_a_state_seen_once_gets_zero():
    # Three trajectories; all start from the prompt ("s0"); 0 and 1 then reach state "a",
    # 2 reaches "b" (seen once). Only trajectory 0 succeeds, at its second turn.
    episode, turns = gigpo_advantages(
        np.array([1.0, 0.0, 0.0]),
        [[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]],
        [["s0", "a"], ["s0", "a"], ["s0", "b"]],
        step_weight=1.0,
        gamma=1.0,
        normalize_std=False,
    )
    np.testing.assert_allclose(episode, [2 / 3, -1 / 3, -1 / 3], atol=1e-6)
    # s0: returns (1, 0, 0) -> (2/3, -1/3, -1/3); a: (1, 0) -> (1/2, -1/2); b: alone -> 0
    np.testing.assert_allclose(turns[0], [2 / 3 + 2 / 3, 2 / 3 + 1 / 2], atol=1e-6)
    np.testing.assert_allclose(turns[1], [-1 / 3 - 1 / 3, -1 / 3 - 1 / 2], atol=1e-6)
    np.testing.assert_allclose(turns[2], [-1 / 3 - 1 / 3, -1 / 3 + 0.0], atol=1e-6)


def test_step_groups_divide_by_their_own_std_and_may_hold_two_turns_of_one_trajectory():
    # Trajectory 0 comes back to state "x" (a loop, as an environment's state_key allows):
    # step group x = {(0, 0), (0, 1), (1, 0)} with returns (1, 1, 0) at gamma 1.
    _, turns = gigpo_advantages(
        np.array([1.0, 0.0]), [[0.0, 1.0], [0.0]], [["x", "x"], ["x"]], step_weight=0.5
    )
    episode = grpo_advantages(np.array([[1.0, 0.0]]))[0]
    step = grpo_advantages(np.array([[1.0, 1.0, 0.0]]))[0]  # (1/3, 1/3, -2/3) / std (0.577)
    np.testing.assert_allclose(turns[0], episode[0] + 0.5 * step[:2], atol=1e-6)
    np.testing.assert_allclose(turns[1], episode[1] + 0.5 * step[2:], atol=1e-6)
    assert turns[0][0] == pytest.approx(0.7071 + 0.5 * 0.5774, abs=1e-3)


def test_step_returns_are_discounted_over_turns_and_take_the_trajectory_level_reward_last():
    # Same states throughout; trajectory 0's reward 1 comes from a reward on the whole
    # transcript (no turn reported it), so it counts as its last turn's: at gamma 0.5 the
    # returns of its turns are (0.25, 0.5, 1), trajectory 1's are 0.
    _, turns = gigpo_advantages(
        np.array([1.0, 0.0]),
        [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
        [["p", "q", "r"], ["p", "q", "r"]],
        gamma=0.5,
        normalize_std=False,
    )
    np.testing.assert_allclose(turns[0], 0.5 + np.array([0.125, 0.25, 0.5]), atol=1e-6)
    np.testing.assert_allclose(turns[1], -0.5 - np.array([0.125, 0.25, 0.5]), atol=1e-6)
    # a turn's own reward counts from that turn on: (r = 1 at turn 0, then 0) returns (1, 0, 0)
    _, turns = gigpo_advantages(
        np.array([1.0, 0.0]),
        [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
        [["p", "q", "r"], ["p", "q", "r"]],
        gamma=0.5,
        normalize_std=False,
    )
    np.testing.assert_allclose(turns[0], [0.5 + 0.5, 0.5, 0.5], atol=1e-6)


def test_a_singleton_group_gets_zero_everywhere_and_bad_shapes_are_refused():
    episode, turns = gigpo_advantages(np.array([1.0]), [[0.0, 1.0]], [["s", "t"]])
    assert episode.tolist() == [0.0] and turns[0].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="2 turn rewards but 1 states"):
        gigpo_advantages(np.array([1.0]), [[0.0, 1.0]], [["s"]])
    with pytest.raises(ValueError, match="2 episode rewards but 1 trajectories"):
        gigpo_advantages(np.array([1.0, 0.0]), [[0.0]], [["s"]])


# ---- the estimator: advantages on each turn's tokens ---------------------------------------


def _two_turn_inputs() -> AdvantageInputs:
    """Two groups of two trajectories in a (4, 10) layout: turn 1 on columns 1-2, an
    observation on 3-4 (mask 0), turn 2 on 5-6; row 3 answered at once (one turn)."""
    mask = np.zeros((4, 10), np.float32)
    turns: list[list[Turn] | None] = []
    for row, states in enumerate([["s", "a"], ["s", "a"], ["s", "b"], ["s"]]):
        spans = [(1, 3), (5, 7)][: len(states)]
        turns.append([Turn(a, b, 0.0, key) for (a, b), key in zip(spans, states, strict=True)])
        for a, b in spans:
            mask[row, a:b] = 1.0
    return AdvantageInputs(
        rewards=np.array([1.0, 0.0, 0.0, 1.0], np.float32),
        mask=mask,
        group_size=2,
        turns=turns,
    )


def _settings(step_weight: float) -> GigpoSettings:
    return GigpoSettings(normalize_std=False, step_weight=step_weight)


def test_estimator_puts_each_turns_advantage_on_its_tokens_and_none_on_observations():
    x = _two_turn_inputs()
    adv = ADVANTAGES.get("gigpo")(x, _settings(step_weight=1.0)).advantages
    assert adv.shape == (4, 10) and adv.dtype == np.float32
    assert np.all(adv[x.mask == 0] == 0)  # observation tokens and padding
    # group 1: episode (0.5, -0.5); s: returns (1, 0) -> +-0.5; a: returns (1, 0) -> +-0.5
    np.testing.assert_allclose(adv[0, 1:3], 1.0)
    np.testing.assert_allclose(adv[0, 5:7], 1.0)
    np.testing.assert_allclose(adv[1, [1, 2, 5, 6]], -1.0)
    # group 2: episode (-0.5, 0.5); s: (0, 1) -> -+0.5; b is seen once: episode only
    np.testing.assert_allclose(adv[2, 1:3], -1.0)
    np.testing.assert_allclose(adv[2, 5:7], -0.5)
    np.testing.assert_allclose(adv[3, 1:3], 1.0)


def test_step_weight_zero_is_grpo_on_every_model_token():
    x = _two_turn_inputs()
    gigpo = ADVANTAGES.get("gigpo")(x, _settings(step_weight=0.0)).advantages
    grpo = ADVANTAGES.get("grpo")(x, GroupNormSettings(normalize_std=False)).advantages
    np.testing.assert_array_equal(gigpo, grpo)
    assert np.count_nonzero(gigpo) == int(x.mask.sum())  # every model token has one


def test_rows_without_turns_get_the_episode_advantage_and_the_kl_penalty_still_applies():
    x = _two_turn_inputs()
    x.turns = None  # single-turn replies: one step each, the whole group's step is the episode
    x.kl_penalty = np.where(x.mask > 0, 0.1, 0.0)
    adv = ADVANTAGES.get("gigpo")(x, _settings(step_weight=1.0)).advantages
    # grpo adds the same penalty-to-go
    without = ADVANTAGES.get("grpo")(x, GroupNormSettings(normalize_std=False)).advantages
    np.testing.assert_allclose(adv, without, atol=1e-6)
    assert adv[0, 6] == pytest.approx(0.5 - 0.1)  # the last token's own penalty


# ---- the rollout's turn records, their batch columns, the metrics --------------------------


# ScriptedEngine hands its replies out in call order: lock-step turns keep that order fixed
# (asynchronous turns batch trajectories by when their steps return).


def test_runner_records_turn_spans_rewards_and_observation_digests(tok):
    runner = EpisodeRunner(
        Calculator(), tok, EnvConfig(max_turns=3, max_total_tokens=200, scheduling="lockstep")
    )
    prompt = Prompt(0, "What is 1+1?", "2", {"expression": "1+1"})
    ids = tok.encode(prompt.text, add_special_tokens=False)
    calls = ["<call>calc 1+1</call>", "<call>calc 2*1</call>", "<call>calc 5</call>"]
    engine = ScriptedEngine(tok, [*calls, "2", "3", "2"])
    [trajectories] = runner.run([prompt], [ids], SamplingParams(n=3, max_new_tokens=30), engine)
    for c, call, answer in zip(trajectories, calls, ["2", "3", "2"], strict=True):
        first, second = c.turns
        assert tok.decode(c.token_ids[first.start : first.end]) == call
        assert tok.decode(c.token_ids[second.start : second.end]) == answer
        assert second.end == len(c.token_ids)
        # every model token is in a turn, every observation token outside
        inside = np.zeros(len(c.token_ids), int)
        for t in c.turns:
            inside[t.start : t.end] = 1
        assert inside.tolist() == c.mask
        assert first.reward == 0.0 and second.reward == c.episode.reward
    a, b, c = (t.turns for t in trajectories)
    assert a[0].state == b[0].state == c[0].state  # the prompt alone
    assert a[1].state == b[1].state  # both saw <result>2</result>
    assert c[1].state != a[1].state and a[1].state != a[0].state  # <result>5</result>
    # the digests are stable: the same rollout again gives the same keys
    engine = ScriptedEngine(tok, [*calls, "2", "3", "2"])
    [again] = runner.run([prompt], [ids], SamplingParams(n=3, max_new_tokens=30), engine)
    assert [t.state for c in again for t in c.turns] == [
        t.state for c in trajectories for t in c.turns
    ]


class CountingGame:
    """Answers every line with " ok"; its state is the count of digits said so far, mod 2,
    and it ends after three turns. An environment with its own ``state_key``."""

    stop = ["\n"]

    def __call__(self, prompt: Prompt) -> CountingEpisode:
        return CountingEpisode()


class CountingEpisode:
    def __init__(self) -> None:
        self.digits, self.turns = 0, 0

    def state_key(self) -> str:
        return f"parity {self.digits % 2}"

    def step(self, action: str) -> StepResult:
        self.digits += sum(ch.isdigit() for ch in action)
        self.turns += 1
        return StepResult(" ok\n", reward=0.5, done=self.turns == 3)


def test_an_environments_state_key_replaces_the_observation_digest(tok):
    runner = EpisodeRunner(
        CountingGame(), tok, EnvConfig(max_turns=3, max_total_tokens=200, scheduling="lockstep")
    )
    engine = ScriptedEngine(tok, ["1\n", "a\n", "2\n", "b\n", "3\n", "c\n"])
    [[x, y]] = runner.run([Prompt(0, "count", "0")], [[5]], SamplingParams(n=2), engine)
    assert [t.state for t in x.turns] == ["parity 0", "parity 1", "parity 0"]  # 0, 1, 2 digits
    assert [t.state for t in y.turns] == ["parity 0", "parity 0", "parity 0"]  # no digits
    assert [t.reward for t in x.turns] == [0.5, 0.5, 0.5]


def test_batch_turns_land_on_the_trained_columns_of_the_batch(tok):
    runner = EpisodeRunner(
        Calculator(), tok, EnvConfig(max_turns=3, max_total_tokens=200, scheduling="lockstep")
    )
    prompt = Prompt(0, "q", "2", {"expression": "1+1"})
    engine = ScriptedEngine(tok, ["<call>calc 1+1</call>", "7", "2"])
    [[c, d]] = runner.run([prompt], [[5, 6, 7]], SamplingParams(n=2, max_new_tokens=30), engine)
    samples = [Sample(prompt, [5, 6, 7], c, "", 1.0), Sample(prompt, [5], d, "", 0.0)]
    groups = [RolloutGroup(prompt, samples)]
    batch = samples_to_batch(samples, tok.pad_token_id)
    turns = batch_turns(groups)
    for row, row_turns in enumerate(turns):
        covered = np.zeros(batch.loss_mask.shape[1])
        for t in row_turns:
            covered[t.start : t.end] = 1
        np.testing.assert_array_equal(covered, batch.loss_mask[row])
    x = AdvantageInputs(batch.rewards, batch.loss_mask, 2, turns=turns)
    adv = ADVANTAGES.get("gigpo")(x, GigpoSettings()).advantages
    assert np.all(adv[batch.loss_mask == 0] == 0) and np.all(adv[batch.loss_mask > 0] != 0)
    flat = Sample(prompt, [5], Completion([1, 2], [0.0, 0.0], "stop", 0), "", 0.0)
    assert batch_turns([RolloutGroup(prompt, [flat, flat])]) is None  # single-turn


def test_step_group_metrics_count_turns_on_shared_states():
    def sample(states: list[str]) -> Sample:
        turns = [Turn(i, i + 1, 0.0, s) for i, s in enumerate(states)]
        completion = Completion([0] * len(states), [0.0] * len(states), "stop", 0, turns=turns)
        return Sample(Prompt(0, "p", "a"), [1], completion, "")

    group = RolloutGroup(
        Prompt(0, "p", "a"), [sample(["s", "a"]), sample(["s", "a"]), sample(["s"])]
    )
    out = step_group_metrics([group])
    # sizes: s -> 3 for three turns, a -> 2 for two turns; both later turns are shared
    assert out["env/step_group_size"] == pytest.approx((3 * 3 + 2 * 2) / 5)
    assert out["env/shared_state_frac"] == 1.0
    lonely = RolloutGroup(Prompt(0, "p", "a"), [sample(["s", "a"]), sample(["s", "b"])])
    assert step_group_metrics([lonely])["env/shared_state_frac"] == 0.0
    assert step_group_metrics([RolloutGroup(Prompt(0, "p", "a"), [])]) == {}


def test_turns_survive_the_checkpoint_state_file(tmp_path):
    # the buffer's queued groups are checkpointed; their multi-turn samples carry turns
    turns = [Turn(0, 3, 0.0, "a1"), Turn(5, 6, 1.0, "b2")]
    completion = Completion([1] * 6, [0.0] * 6, "stop", 2, mask=[1, 1, 1, 0, 0, 1], turns=turns)
    group = RolloutGroup(Prompt(0, "p", "a"), [Sample(Prompt(0, "p", "a"), [1], completion, "")])
    write_state(tmp_path / "state.json", {"groups": [group]})
    [back] = read_state(tmp_path / "state.json")["groups"]
    assert back.samples[0].completion.turns == turns


# ---- config ----------------------------------------------------------------------------------


def test_gigpo_needs_a_multi_turn_task_and_a_non_negative_step_weight():
    with pytest.raises(ConfigError, match=r"task\.env\.name=null.*set task\.env\.name"):
        load_config(["algorithm.advantage=gigpo"])
    with pytest.raises(ConfigError, match="algorithm.gigpo_step_weight"):
        load_config(["algorithm=gigpo", "task=calculator_tool", "algorithm.gigpo_step_weight=-1"])
    cfg = load_config(["algorithm=gigpo", "task=calculator_tool"])
    assert uses_turns(cfg.algorithm) and cfg.algorithm.gamma == 0.95
    assert cfg.algorithm.gigpo_step_weight == 1.0
