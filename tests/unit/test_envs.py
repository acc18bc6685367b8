"""Multi-turn environments: the tool-call parser, the calculator and guessing game, the
episode runner's masks/budgets/turn bounds, SFT demonstrations and their packing."""

from __future__ import annotations

import numpy as np
import pytest

from rlsys.config.env import EnvConfig
from rlsys.config.errors import ConfigError
from rlsys.config.schema import TaskConfig
from rlsys.data.collate import pack, samples_to_batch
from rlsys.data.tasks import load_task
from rlsys.envs import ENVS, EpisodeRunner
from rlsys.envs.calculator import Calculator, evaluate
from rlsys.envs.guess_number import GuessNumber
from rlsys.envs.tools import ToolCall, ToolCallError, find_call, format_call
from rlsys.models.loading import load_tokenizer
from rlsys.trainers.collector import RolloutCollector
from rlsys.types import Completion, Prompt, SamplingParams


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def test_tool_calls_parse_in_both_formats_and_malformed_ones_raise():
    assert find_call("no call here") is None
    assert find_call("x <call>calc 3*4</call>") == ToolCall("calc", "3*4")
    assert find_call('<call>{"name": "calc", "arguments": {"e": "1"}}</call>') == ToolCall(
        "calc", {"e": "1"}
    )
    assert find_call(format_call("calc", "1+2")) == ToolCall("calc", "1+2")
    assert find_call("<call>a 1</call> then <call>b 2</call>").name == "b"  # the last one
    for bad in ("<call>{not json</call>", "<call>9x 1</call>", '<call>{"arguments": 1}</call>'):
        with pytest.raises(ToolCallError):
            find_call(bad)


def test_calculator_evaluates_arithmetic_and_refuses_everything_else():
    assert evaluate("37*48") == 1776 and evaluate("(1+2)*-3") == -9 and evaluate("7/2") == 3.5
    for bad in ("__import__('os')", "2**99999", "9" * 70, "1/0", "a+1", "99999999*99999999"):
        with pytest.raises(ValueError):
            evaluate(bad)


def test_calculator_episode_answers_calls_and_scores_the_final_answer():
    env = Calculator()(Prompt(0, "q", "1776", {"expression": "37*48"}))
    out = env.step("<call>calc 37*48</call>")
    assert out.observation == "<result>1776</result>" and out.tool_call and not out.done
    out = env.step("<call>calc 37*</call>")
    assert out.tool_error and "error" in out.observation and not out.done
    assert env.step("<call>python 1</call>").tool_error
    out = env.step("1776")
    assert out.done and out.correct and out.reward == 1.0
    out = env.step("1777")
    assert out.done and not out.correct and out.reward == 0.0


def test_guess_number_game_and_its_binary_search_demonstration():
    prompt = Prompt(0, "Guess", "7", {"low": 1, "high": 10})
    env = GuessNumber()(prompt)
    assert env.step("5\n").observation == " higher\n"
    assert env.step("9\n").observation == " lower\n"
    assert env.step("hmm").tool_error
    assert env.step("7").correct
    demo = GuessNumber().demonstration(prompt)
    assert [text for text, model in demo if model] == ["5\n", "8\n", "6\n", "7"]
    assert all(not model for text, model in demo if "higher" in text or "lower" in text)


class ScriptedEngine:
    """Stands in for a rollout engine: replies with scripted texts, token per character (a
    trailing "$" becomes EOS), and records what it was asked."""

    def __init__(self, tok, replies: list[str]) -> None:
        self.tok, self.replies, self.calls = tok, list(replies), []

    def __call__(self, prompt_ids, sampling, budgets):
        self.calls.append((prompt_ids, sampling, budgets))
        out = []
        for i, _ in enumerate(prompt_ids):
            group = []
            for _ in range(sampling.n):
                text = self.replies.pop(0)
                ids = self.tok.encode(text.removesuffix("$"), add_special_tokens=False)
                ids += [self.tok.eos_token_id] * text.endswith("$")
                limit = budgets[i] if budgets else sampling.max_new_tokens
                finish = "length" if len(ids) > limit else "stop"
                ids = ids[:limit]
                group.append(Completion(ids, [-0.5] * len(ids), finish, version=3))
            out.append(group)
        return out


def test_episode_runner_masks_observations_and_keeps_the_models_tokens(tok):
    # lock-step: ScriptedEngine hands replies out in call order, which asynchronous turns
    # (tests/unit/test_async_turns.py) make depend on when each step returns
    runner = EpisodeRunner(Calculator(), tok, EnvConfig(max_turns=3, scheduling="lockstep"))
    prompt = Prompt(0, "Ann buys 37 bags of 48 pens.", "1776", {"expression": "37*48"})
    ids = tok.encode(prompt.text, add_special_tokens=False)
    replies = ["<call>calc 37*48</call>", "<call>calc 1+1</call>", "1776", "2"]
    engine = ScriptedEngine(tok, replies)
    [[good, early]] = runner.run([prompt], [ids], SamplingParams(n=2, max_new_tokens=24), engine)
    # turn 1 samples both trajectories at once with the tool's stop string
    assert engine.calls[0][1].n == 2 and "</call>" in engine.calls[0][1].stop
    # turn 2 continues both, each on its own prompt + transcript, with what is left
    assert engine.calls[1][1].n == 1 and engine.calls[1][0][0][: len(ids)] == ids
    text = tok.decode(good.token_ids)
    assert text == "<call>calc 37*48</call><result>1776</result>1776"
    result = "<result>1776</result>"
    start = len("<call>calc 37*48</call>")
    assert good.mask == [1] * start + [0] * len(result) + [1] * 4
    assert good.logprobs[start : start + len(result)] == [0.0] * len(result)
    assert good.episode.correct and good.episode.reward == 1.0 and good.episode.turns == 2
    assert good.episode.tool_calls == 1 and good.token_versions == [3] * len(good.token_ids)
    assert early.episode.turns == 2 and not early.episode.correct
    assert engine.calls[1][2] == [24, 24]  # each turn's bound (72 - 44 tokens left)


def test_episode_runner_bounds_turns_and_total_tokens(tok):
    calls = ["<call>calc 1+1</call>"] * 10
    runner = EpisodeRunner(Calculator(), tok, EnvConfig(max_turns=2, max_total_tokens=100))
    [[c]] = runner.run(
        [Prompt(0, "q", "2")], [[5]], SamplingParams(max_new_tokens=24), ScriptedEngine(tok, calls)
    )
    assert c.episode.turns == 2 and c.episode.truncated and not c.episode.correct
    assert sum(c.mask) == 2 * len(calls[0])  # no observation after the last turn
    runner = EpisodeRunner(Calculator(), tok, EnvConfig(max_turns=9, max_total_tokens=60))
    engine = ScriptedEngine(tok, calls)
    [[c]] = runner.run([Prompt(0, "q", "2")], [[5]], SamplingParams(max_new_tokens=24), engine)
    assert len(c.token_ids) <= 60 and c.episode.truncated
    assert all(b <= 24 for _, _, budgets in engine.calls[1:] for b in budgets)


def test_pack_applies_response_masks_and_samples_to_batch_uses_them(tok):
    batch = pack([[1, 2], [3]], [[4, 5, 6], [7]], 0, [[-1, -2, -3], [-4]], [[1, 0, 1], None])
    # prompt width 2: response j's target sits at logprob index 1 + j
    assert batch.loss_mask[0].tolist() == [0, 1, 0, 1]
    assert batch.loss_mask[1].tolist() == [0, 1, 0, 0]
    runner = EpisodeRunner(Calculator(), tok, EnvConfig())
    prompt = Prompt(0, "q", "2", {"expression": "1+1"})
    engine = ScriptedEngine(tok, ["<call>calc 1+1</call>", "2"])
    collector = RolloutCollector(None, tok, None, 64, episodes=runner)
    [[c]] = runner.run([prompt], [[5, 6]], SamplingParams(max_new_tokens=24), engine)
    [group] = collector.build_groups([prompt], [[5, 6]], [[c]])
    batch = samples_to_batch(group.samples, tok.pad_token_id)
    assert batch.loss_mask.sum() == sum(c.mask)
    assert np.all(batch.behaviour_logprobs[batch.loss_mask == 0] == 0)


def test_demonstrations_mask_observations_and_end_in_eos(tok):
    task = TaskConfig(
        name="word_problems",
        reward="env",
        reverse_answer=False,
        operators=["*"],
        train_size=20,
        eval_size=5,
        env=EnvConfig(name="calculator"),
    )
    collector = RolloutCollector.for_task(None, tok, task)
    prompt = load_task(task, 0).train[0]
    ids, mask = collector.demonstration(prompt)
    a, b = prompt.meta["expression"].split("*")
    assert (
        tok.decode(ids[:-1])
        == f"<call>calc {a}*{b}</call><result>{int(a) * int(b)}</result>{prompt.answer}"
    )
    assert ids[-1] == tok.eos_token_id and mask[-1] == 1
    assert 0 in mask and len(mask) == len(ids)


def test_word_problems_are_unique_deterministic_and_env_reward_needs_an_env():
    cfg = TaskConfig(
        name="word_problems",
        reward="env",
        reverse_answer=False,
        operators=["+", "-", "*"],
        train_size=300,
        eval_size=50,
        env=EnvConfig(name="calculator"),
    )
    a, b = load_task(cfg, 1), load_task(cfg, 1)
    texts = [p.text for p in a.train + a.eval]
    assert len(set(texts)) == 350 and texts == [p.text for p in b.train + b.eval]
    assert all(str(evaluate(p.meta["expression"])) == p.answer for p in a.train)
    assert "calculator" in ENVS.names() and "guess_number" in ENVS.names()
    with pytest.raises(ConfigError, match="task.env.name"):
        TaskConfig(reward="env")


def test_an_environment_registers_itself_with_settings_from_task_env_args():
    """Each built-in module registers its own factory (rlsys/envs/__init__.py imports them
    all); an environment with settings gets them from task.env.args, checked at load."""
    from rlsys.envs import env_settings, make_factory
    from rlsys.envs.latency import Latency, LatencySettings
    from rlsys.resolve import load_config

    assert ENVS.names() == ["calculator", "guess_number", "latency", "search", "sql"]
    assert ENVS.settings("latency") is LatencySettings and ENVS.settings("sql") is None
    cfg = load_config(["task.env.name=latency", "task.env.args={latency_s: 0.0, turns: 2}"])
    assert env_settings(cfg.task.env) == LatencySettings(latency_s=0.0, turns=2)
    factory = make_factory(cfg.task.env)
    assert isinstance(factory, Latency) and factory.settings.turns == 2
    assert [t for t, model in factory.demonstration(Prompt(0, "q", "")) if model] == ["go\n", "go"]
    episode = factory(Prompt(0, "q", ""))
    assert not episode.step("go").done and episode.step("go").done  # after 2 turns
    assert isinstance(make_factory(EnvConfig(name="calculator")), Calculator)  # no settings
    with pytest.raises(ConfigError, match=r"task.env.args.turn is not a setting of .*latency"):
        load_config(["task.env.name=latency", "task.env.args={turn: 2}"])
    with pytest.raises(ConfigError, match=r"task.env.args: turns=0 must be >= 1"):
        load_config(["task.env.name=latency", "task.env.args={turns: 0}"])
    with pytest.raises(ConfigError, match=r"task.env.args.x is not a setting of .*calculator"):
        load_config(["task.env.name=calculator", "task.env.args={x: 1}"])
    with pytest.raises(ConfigError, match="task.env.name is null"):
        load_config(["task.env.args={turns: 2}"])


def test_turn_end_is_decided_by_token_ids_and_failures_end_only_their_trajectory(tok):
    env = EnvConfig(max_turns=4, max_total_tokens=200, scheduling="lockstep")
    runner = EpisodeRunner(Calculator(), tok, env)
    prompt = Prompt(0, "q", "2")
    # text after the stop string inside the stopping turn (as BPE tokens or vLLM may keep)
    # still continues; a call followed by EOS ends the reply
    engine = ScriptedEngine(tok, ["<call>calc 1+1</call>\n", "<call>calc 1+1</call>$", "2"])
    [[a, b]] = runner.run([prompt], [[5]], SamplingParams(n=2, max_new_tokens=30), engine)
    assert a.episode.turns == 2 and a.episode.correct and a.finish_reason == "stop"
    assert b.episode.turns == 1 and b.episode.tool_calls == 1 and not b.episode.correct

    class Broken:
        stop = ["</call>"]

        def __call__(self, prompt):
            return self

        def step(self, action):
            raise RuntimeError("environment bug")

    runner = EpisodeRunner(Broken(), tok, EnvConfig())
    [[c]] = runner.run(
        [prompt], [[5]], SamplingParams(max_new_tokens=8), ScriptedEngine(tok, ["x"])
    )
    assert c.episode.tool_errors == 1 and c.episode.turns == 1 and not c.episode.correct
    # a trajectory cut by max_turns reports a length finish (overlong filtering sees it)
    runner = EpisodeRunner(Calculator(), tok, EnvConfig(max_turns=1))
    calls = ScriptedEngine(tok, ["<call>calc 1+1</call>"])
    [[d]] = runner.run([prompt], [[5]], SamplingParams(max_new_tokens=30), calls)
    assert d.finish_reason == "length" and d.episode.truncated


def test_deeply_nested_json_calls_are_malformed_not_crashes():
    with pytest.raises(ToolCallError):
        find_call('<call>{"name": ' + "[" * 5000 + "</call>")
