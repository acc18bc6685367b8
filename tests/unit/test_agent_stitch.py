"""Training on what agent sessions recorded: the stitching rule on hand-made calls (an
extended conversation, an EOS the template rewrites, rewritten history, a side question), and
AgentRunner running the example calculator agent (real openai client, real endpoint) over a
scripted ``complete``: one trajectory per agent run with tool results masked, its reward the
agent's return, failures and timeouts scored 0, the run's end passed on."""

from __future__ import annotations

import time

import pytest

from rlsys.agents.examples import calculator_agent
from rlsys.agents.runner import AgentRunner, load_agent
from rlsys.agents.session import RecordedCall
from rlsys.agents.stitch import stitch
from rlsys.config.env import EnvConfig
from rlsys.config.errors import ConfigError
from rlsys.envs.tool_formats import HermesFormat
from rlsys.models.loading import load_tokenizer
from rlsys.types import Completion, Prompt, SamplingParams


def _call(prompt, tokens, version=0, lp=-0.5, finish="stop") -> RecordedCall:
    logprobs = [lp - i for i in range(len(tokens))]
    return RecordedCall(
        prompt, tokens, logprobs, [version] * len(tokens), finish, "", "", "", len(tokens), ""
    )


def test_an_extended_conversation_trains_every_reply_and_masks_the_rest():
    calls = [_call([1, 2, 3], [4, 5], 0), _call([1, 2, 3, 4, 5, 9, 9], [6, 7], 1, lp=-0.1)]
    c = stitch(calls)
    assert c.prompt_ids == [1, 2, 3]
    assert c.token_ids == [4, 5, 9, 9, 6, 7]
    assert c.mask == [1, 1, 0, 0, 1, 1]
    assert c.logprobs == [-0.5, -1.5, 0.0, 0.0, -0.1, -1.1]
    assert c.token_versions == [0, 0, 0, 0, 1, 1] and c.version == 0
    assert c.episode.turns == 2 and c.episode.dropped_calls == 0


def test_a_reply_token_the_later_prompt_rewrites_is_masked():
    # the first reply ended in EOS (99); the template wrote its own turn end (8) instead
    calls = [_call([1, 2], [4, 5, 99], 2), _call([1, 2, 4, 5, 8, 3], [6], 3)]
    c = stitch(calls)
    assert c.token_ids == [4, 5, 8, 3, 6]
    assert c.mask == [1, 1, 0, 0, 1]
    assert c.token_versions == [2, 2, 2, 2, 3]


def test_rewritten_history_keeps_the_calls_the_final_one_extends():
    calls = [
        _call([1, 2, 3], [4, 5]),  # its reply was rewritten to 7 7 below: dropped
        _call([1, 2, 3, 7, 7], [6]),
        _call([1, 2, 3, 7, 7, 6, 8], [9]),
    ]
    c = stitch(calls)
    assert c.prompt_ids == [1, 2, 3, 7, 7]  # the rewritten reply is prompt, never trained
    assert c.token_ids == [6, 8, 9] and c.mask == [1, 0, 1]
    assert c.episode.dropped_calls == 1 and c.episode.turns == 2


def test_a_side_question_after_the_conversation_is_dropped():
    calls = [_call([1, 2], [4]), _call([1, 2, 4, 5], [6]), _call([20, 21], [22])]
    c = stitch(calls)
    assert c.prompt_ids == [1, 2] and c.token_ids == [4, 5, 6] and c.mask == [1, 0, 1]
    assert c.episode.dropped_calls == 1


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)  # its chat template: builtin.CHAT_TEMPLATE


CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": "37*48"}}\n</tool_call>'


def _runner(tokenizer, agent, **env) -> AgentRunner:
    cfg = EnvConfig(name="openai_agent", agent="x:y", tool_format="hermes", **env)
    return AgentRunner(agent, tokenizer, HermesFormat(native=False), cfg, 4096)


class ScriptedPolicy:
    """``complete`` as a model that calls calc first and answers after the tool's result."""

    def __init__(self, tokenizer) -> None:
        self.tok, self.batches, self.stops = tokenizer, [], []

    def __call__(self, prompt_ids, sampling, budgets):
        self.batches.append(len(prompt_ids))
        self.stops.append(sampling.stop)
        out = []
        for ids in prompt_ids:
            seen_result = "<tool_response>" in self.tok.decode(ids)
            text = "The answer is 1776" if seen_result else CALL
            tokens = self.tok.encode(text, add_special_tokens=False)
            tokens += [self.tok.eos_token_id] if seen_result else []
            out.append([Completion(tokens, [-0.25] * len(tokens), "stop", 3)])
        return out


def test_the_calculator_agent_trains_through_the_endpoint(tokenizer):
    # a call waits for the other live agent's (at most 5 s), so the batches are deterministic
    runner = _runner(tokenizer, calculator_agent, batch_wait_s=5.0)
    policy = ScriptedPolicy(tokenizer)
    prompt = Prompt(0, "What is 37*48?", "1776")
    sampling = SamplingParams(n=2, max_new_tokens=128)
    [[a, b]] = runner.run([prompt], [[5, 6]], sampling, policy)
    assert policy.batches == [2, 2]  # both agents' calls went out together, turn by turn
    assert all("</tool_call>" in stop for stop in policy.stops)
    call_ids = tokenizer.encode(CALL, add_special_tokens=False)
    answer_ids = tokenizer.encode("The answer is 1776", add_special_tokens=False)
    answer_ids += [tokenizer.eos_token_id]
    for c in (a, b):
        assert "What is 37*48?" in tokenizer.decode(c.prompt_ids)  # the agent's own prompt
        assert (
            c.token_ids[: len(call_ids)] == call_ids
            and c.token_ids[-len(answer_ids) :] == answer_ids
        )
        observation = c.token_ids[len(call_ids) : -len(answer_ids)]
        assert "<tool_response>\n1776\n</tool_response>" in tokenizer.decode(observation)
        assert c.mask == [1] * len(call_ids) + [0] * len(observation) + [1] * len(answer_ids)
        assert [lp for lp, m in zip(c.logprobs, c.mask, strict=True) if m] == [-0.25] * (
            len(call_ids) + len(answer_ids)
        )
        assert set(c.logprobs[len(call_ids) : -len(answer_ids)]) == {0.0}
        assert c.versions() == [3] * len(c.token_ids)
        e = c.episode
        assert (e.reward, e.correct, e.turns, e.tool_calls, e.dropped_calls) == (1.0, True, 2, 1, 0)
        assert not e.agent_error


def broken_agent(client, prompt):
    raise RuntimeError("agent bug")


def slow_agent(client, prompt):
    time.sleep(3)
    return 1.0


def rewriting_agent(client, prompt):
    """Asks twice, the second time with a reply it wrote itself: the first call is dropped."""
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
    fake = {"role": "assistant", "content": "I made this up"}
    messages = [{"role": "user", "content": "a"}, fake, {"role": "user", "content": "go"}]
    client.chat.completions.create(model="m", messages=messages)
    return 0.5


def test_failing_slow_and_rewriting_agents(tokenizer):
    sampling = SamplingParams(n=1, max_new_tokens=128)
    prompts = [Prompt(0, "q", "1")]
    [[broken]] = _runner(tokenizer, broken_agent).run(
        prompts, [[5]], sampling, ScriptedPolicy(tokenizer)
    )
    assert broken.episode.agent_error and broken.episode.reward == 0.0
    assert broken.token_ids == [tokenizer.eos_token_id] and broken.mask == [0]

    began = time.monotonic()
    runner = _runner(tokenizer, slow_agent, agent_timeout_s=0.3)
    [[slow]] = runner.run(prompts, [[5]], sampling, ScriptedPolicy(tokenizer))
    assert time.monotonic() - began < 2.5  # did not wait for the agent
    assert slow.episode.agent_error and slow.episode.reward == 0.0

    runner = _runner(tokenizer, rewriting_agent)
    [[c]] = runner.run(prompts, [[5]], sampling, ScriptedPolicy(tokenizer))
    assert c.episode.dropped_calls == 1 and c.episode.reward == 0.5 and c.episode.turns == 1
    assert "I made this up" in tokenizer.decode(c.prompt_ids)  # prompt, not trained
    assert c.mask == [1] * len(c.token_ids)


def test_a_batch_whose_first_prompts_are_all_too_long_stops_the_run(tokenizer):
    # a setting (task.max_prompt_tokens), not an agent's failure: without the error every
    # batch would train on nothing while the run looked healthy
    cfg = EnvConfig(name="openai_agent", agent="x:y", tool_format="hermes")
    runner = AgentRunner(calculator_agent, tokenizer, HermesFormat(native=False), cfg, 16)
    sampling = SamplingParams(n=2, max_new_tokens=128)
    with pytest.raises(ConfigError, match=r"task\.max_prompt_tokens=16.*Raise"):
        runner.run(
            [Prompt(0, "What is 37*48?", "1776")], [[5]], sampling, ScriptedPolicy(tokenizer)
        )


def test_the_run_ending_ends_the_rollout(tokenizer):
    runner = _runner(tokenizer, calculator_agent)
    out = runner.run([Prompt(0, "q", "1")], [[5]], SamplingParams(), lambda *a: None)
    assert out is None


def test_the_agent_key_must_name_a_function():
    with pytest.raises(ConfigError, match="task.env.agent"):
        load_agent("rlsys.agents.examples:no_such_agent")
    with pytest.raises(ConfigError, match="task.env.agent=package.module:function"):
        EnvConfig(name="openai_agent")
    with pytest.raises(ConfigError, match="task.env.name=openai_agent"):
        EnvConfig(name="calculator", agent="a:b")
    assert load_agent("rlsys.agents.examples:calculator_agent") is calculator_agent


def test_openai_agent_needs_the_chat_template():
    from rlsys.resolve import load_config

    keys = ["task.env.name=openai_agent", "task.env.agent=rlsys.agents.examples:calculator_agent"]
    with pytest.raises(ConfigError, match="task.chat_template=true"):
        load_config(keys)
    with pytest.raises(ConfigError, match="task.env.tool_format"):
        load_config([*keys, "task.chat_template=true", "task.env.tool_format=compact"])
    with pytest.raises(ConfigError, match="warm_start.enabled=false"):
        load_config([*keys, "task.chat_template=true"])
    cfg = load_config([*keys, "task.chat_template=true", "warm_start.enabled=false"])
    assert cfg.task.env.agent == "rlsys.agents.examples:calculator_agent"
