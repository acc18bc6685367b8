"""Config of the task: built-in generators, dataset files, prompt formatting (``task.*``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlsys.config.checks import non_negative, one_of, positive
from rlsys.config.env import AGENT_ENV, EnvConfig
from rlsys.config.errors import ConfigError
from rlsys.config.shapes import ShapesConfig


@dataclass
class TaskConfig:
    """The verifiable task: a built-in arithmetic family, a jsonl/parquet dataset, or the
    prompts of a built-in environment (word_problems, guess_number, sql, search; see
    ``task.env``), or the RLHF example's review continuations (reviews; see
    ``rlsys.data.reviews``)."""

    # arithmetic | arithmetic_scratchpad | file | word_problems | guess_number | sql | search | reviews
    name: str = "arithmetic"
    reward: str = "exact_match"  # reward function from the rewards registry
    # Arithmetic difficulty knobs.
    digits: int = 2  # operands have 1..digits digits
    operators: list[str] = field(default_factory=lambda: ["+"])  # any of + - *
    # arithmetic_scratchpad: how many operands a sum chains (each count equally likely)
    operand_counts: list[int] = field(default_factory=lambda: [3, 4])
    reverse_answer: bool = True  # write the zero-padded answer least-significant digit first
    pad_operands: bool = False  # true: "05+29=" (one prompt shape for every problem)
    # How an arithmetic problem reads: "compact" is "a+b=" with the answer written as above
    # (for built-in models); "question" is "What is a + b?" with a plain decimal answer (for
    # pretrained chat models, with chat_template and a last_number/boxed reward).
    style: str = "compact"
    train_size: int = 9500  # distinct training problems
    eval_size: int = 500  # held-out problems (file tasks: held out of train_path if no eval_path)
    # Seed of the task's problems and of its train / held-out split; null: run.seed. Set it
    # to compare seeds on one held-out set (run.seed then varies only the run's own draws).
    split_seed: int | None = None
    # File datasets (task.name=file).
    train_path: str | None = None  # .jsonl, .json (lines or one array), .parquet or .csv
    eval_path: str | None = None  # null: hold out eval_size rows of train_path
    # Column holding the prompt: text, or chat messages [{role, content}] (verl's layout, rendered
    # with the model's chat template). Dotted paths reach nested columns: extra_info.question.
    prompt_key: str = "prompt"
    # Column holding the ground truth (dotted paths too); left at "answer", a row without that
    # column uses verl's reward_model.ground_truth.
    answer_key: str = "answer"
    # column holding an image (a path, encoded bytes or a data:image/...;base64 URL, or a
    # list of them), shown before the prompt text; null: text only. Needs a VL model.
    image_key: str | None = None
    shapes: ShapesConfig = field(default_factory=ShapesConfig)  # task.name=shapes only
    # Longer prompts (as formatted: chat template, instruction, image tokens) are left out,
    # counted, with a warning per split naming how many and the longest. null: what the
    # model's context leaves a prompt, resolved when a command loads the model: its
    # max_position_embeddings (the text config's; at most rollout.vllm.max_model_len) minus
    # the response bound (the task's max_new_tokens, eval.max_new_tokens if larger; with
    # task.env a whole trajectory's: env.max_total_tokens, or max_new_tokens x max_turns)
    max_prompt_tokens: int | None = None
    max_new_tokens: int | None = None  # null: the task's own bound (arithmetic: answer + EOS)
    # Prompt formatting (any task): what the model sees around each prompt's text.
    instruction: str | None = None  # appended to every prompt, e.g. how to give the answer
    chat_template: bool = False  # send the prompt as a user turn of the tokenizer's template
    system_prompt: str | None = None  # chat only: the system turn (null: the template's own)
    env: EnvConfig = field(default_factory=EnvConfig)  # multi-turn environment (null: none)

    def __post_init__(self) -> None:
        one_of("task.style", self.style, ("compact", "question"))
        if self.style != "compact" and self.reverse_answer:
            raise ConfigError(
                f"task.reverse_answer=true only applies to task.style=compact, not "
                f"task.style={self.style}; set task.reverse_answer=false"
            )
        for key in ("instruction", "system_prompt"):
            value = getattr(self, key)
            if value is not None and not value.strip():
                raise ConfigError(f"task.{key}={value!r} is blank; give it text or set it to null")
        if self.system_prompt is not None and not self.chat_template:
            raise ConfigError(
                "task.system_prompt needs task.chat_template=true (a system turn only exists "
                "in a chat template); set task.chat_template=true or task.system_prompt=null"
            )
        positive("task.digits", self.digits)
        positive("task.train_size", self.train_size)
        positive("task.eval_size", self.eval_size)
        if self.split_seed is not None:
            non_negative("task.split_seed", self.split_seed)
        if self.max_prompt_tokens is not None:
            positive("task.max_prompt_tokens", self.max_prompt_tokens)
        if self.max_new_tokens is not None:
            positive("task.max_new_tokens", self.max_new_tokens)
        if not self.operand_counts or any(c < 2 for c in self.operand_counts):
            raise ConfigError(
                f"task.operand_counts={list(self.operand_counts)} must be a non-empty list of "
                "counts >= 2 (a sum needs two operands); e.g. task.operand_counts=[3,4]"
            )
        bad = [op for op in self.operators if op not in ("+", "-", "*")]
        if bad or not self.operators:
            raise ConfigError(
                f"task.operators={list(self.operators)} must be a non-empty subset of "
                "['+', '-', '*']"
            )
        if self.env.tool_format in ("hermes", "smollm2") and not self.chat_template:
            raise ConfigError(
                f"task.env.tool_format={self.env.tool_format} needs task.chat_template=true (its "
                "tools are declared and its results sent as turns of the chat template); set "
                "task.chat_template=true or task.env.tool_format=compact (or auto)"
            )
        if self.env.name == AGENT_ENV and not self.chat_template:
            raise ConfigError(
                f"task.env.name={AGENT_ENV} renders the agent's messages with the chat "
                "template; set task.chat_template=true (with a model whose tokenizer has one)"
            )
        if self.reward == "env" and self.env.name is None:
            raise ConfigError(
                "task.reward=env scores with the environment's reward, but task.env.name is "
                "null; set task.env.name (calculator | guess_number | sql | search) or another "
                "task.reward"
            )
        if self.name == "file" and not self.train_path:
            raise ConfigError("task.name=file needs task.train_path=<file.jsonl|file.parquet>")
