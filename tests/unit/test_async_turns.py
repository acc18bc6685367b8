"""Asynchronous multi-turn scheduling (``task.env.scheduling=async``) with a fake engine
``complete`` and fake environments: token/mask layouts, a slow tool not holding back the
other trajectories, step timeouts and failures, the run ending, per-tool limits and
partial-rollout continuation through the rollout loop."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from rlsys.buffer.streaming import StreamingBuffer
from rlsys.config.env import EnvConfig
from rlsys.config.errors import ConfigError
from rlsys.envs.base import StepResult
from rlsys.envs.rollout import EpisodeRunner
from rlsys.pipeline.gate import RolloutGate
from rlsys.pipeline.rollout import RolloutLoop
from rlsys.types import Completion, Prompt, SamplingParams

TURN, OBSERVATION = "g\n", " o"
WAIT_S = 2.0  # how long the slow tool waits for the other trajectory to finish


class CharTokenizer:
    """One token per character; id 0 is EOS."""

    eos_token_id = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i != 0)


class Engine:
    """A ``complete`` that answers every prompt with ``TURN`` (version = call number) and
    logs each call: which trajectories (their first prompt token) and budgets it had."""

    def __init__(self, end_after: int | None = None) -> None:
        self.calls: list[tuple[list[int], list[int] | None, SamplingParams]] = []
        self.end_after = end_after  # calls answered before the run "ends" (None)

    def __call__(self, prompts, sampling, budgets):
        if self.end_after is not None and len(self.calls) >= self.end_after:
            return None
        self.calls.append(([p[0] for p in prompts], budgets, sampling))
        ids = [ord(c) for c in TURN]
        version = len(self.calls)
        return [
            [Completion(ids, [-0.5] * len(ids), "stop", version) for _ in range(sampling.n)]
            for _ in prompts
        ]

    def turns_of(self, uid: int) -> list[int]:
        """Indices of the calls that generated a turn of prompt ``uid``."""
        return [i for i, (keys, _, _) in enumerate(self.calls) if 1000 + uid in keys]


class Env:
    """Answers ``OBSERVATION`` until its ``turns``-th step, which ends it; ``hook(step)``
    runs first (sleeps, waits, raises)."""

    def __init__(self, turns: int, hook=None) -> None:
        self.turns, self.hook, self.steps = turns, hook, 0

    def step(self, action: str) -> StepResult:
        self.steps += 1
        if self.hook is not None:
            self.hook(self.steps)
        if self.steps >= self.turns:
            return StepResult(reward=1.0, done=True, tool_call=True, correct=True)
        return StepResult(OBSERVATION, tool_call=True)


class Factory:
    stop = ["\n"]

    def __init__(self, envs: dict[int, tuple[int, object]], tool_limits=None) -> None:
        self.envs = envs  # prompt uid -> (turns, hook)
        if tool_limits is not None:
            self.tool_limits = tool_limits

    def __call__(self, prompt: Prompt) -> Env:
        return Env(*self.envs[prompt.uid])


def run(factory: Factory, engine, **cfg):
    runner = EpisodeRunner(factory, CharTokenizer(), EnvConfig(**cfg))
    prompts = [Prompt(uid, "q", "1") for uid in factory.envs]
    ids = [[1000 + p.uid] for p in prompts]
    return runner.run(prompts, ids, SamplingParams(max_new_tokens=8), engine)


def test_trajectories_of_different_lengths_keep_their_token_and_mask_layout():
    engine = Engine()
    out = run(Factory({0: (1, None), 1: (2, None), 2: (3, None), 3: (9, None)}), engine)
    turn, obs = [ord(c) for c in TURN], [ord(c) for c in OBSERVATION]
    for uid, [c] in enumerate(out):
        turns = min(uid + 1, 4)  # the fourth is cut by max_turns=4
        assert c.token_ids == (turn + obs) * (turns - 1) + turn
        assert c.mask == ([1] * 2 + [0] * 2) * (turns - 1) + [1] * 2
        assert c.logprobs == ([-0.5] * 2 + [0.0] * 2) * (turns - 1) + [-0.5] * 2
        versions = c.token_versions
        assert versions[2::4] == versions[0::4][: turns - 1]  # observations: their turn's
        assert versions[0::4] == [i + 1 for i in engine.turns_of(uid)]  # the call's version
        assert c.episode.turns == turns and c.episode.tool_calls == turns
        assert c.episode.truncated == (uid == 3) and c.finish_reason == (
            "length" if uid == 3 else "stop"
        )
        assert c.episode.tool_s >= 0.0 and c.episode.tool_timeouts == 0
    # every later call continues single trajectories within their budget
    assert all(s.n == 1 and all(b <= 8 for b in budgets) for _, budgets, s in engine.calls[1:])


@pytest.mark.parametrize("scheduling", ["async", "lockstep"])
def test_a_slow_tool_does_not_hold_back_the_other_trajectories(scheduling):
    # A's tool returns only once B has finished all three turns (or after WAIT_S)
    b_done = threading.Event()
    waited = []
    slow = lambda step: waited.append(b_done.wait(WAIT_S)) if step == 1 else None  # noqa: E731
    last = lambda step: b_done.set() if step == 3 else None  # noqa: E731
    engine = Engine()
    [[a], [b]] = run(Factory({0: (2, slow), 1: (3, last)}), engine, scheduling=scheduling)
    assert a.episode.turns == 2 and b.episode.turns == 3
    if scheduling == "async":
        assert waited == [True]  # B's turns went on while A's tool ran
        a_turn2 = engine.turns_of(0)[1]
        assert all(i < a_turn2 for i in engine.turns_of(1))  # B finished first
        assert a.episode.tool_overlap_s > 0.0  # A's tool ran while B generated
    else:  # every turn waits for every tool: A's tool waited out WAIT_S
        assert waited == [False]
        assert engine.turns_of(0)[1] == engine.turns_of(1)[1]
        assert a.episode.tool_overlap_s == 0.0


@pytest.mark.parametrize("scheduling", ["async", "lockstep"])
def test_a_hung_step_times_out_and_the_request_finishes(scheduling):
    release = threading.Event()
    hang = lambda step: release.wait(30)  # noqa: E731
    try:
        # one step slot: the others can only run once the hung step gives its slot back
        [[a], [b]] = run(
            Factory({0: (3, hang), 1: (3, None)}),
            Engine(),
            scheduling=scheduling,
            step_timeout_s=0.2,
            max_concurrent_steps=1,
        )
        assert a.episode.tool_timeouts == 1 and a.episode.tool_errors == 1
        assert a.episode.turns == 1 and not a.episode.correct
        assert a.episode.tool_s >= 0.2
        assert b.episode.turns == 3 and b.episode.correct and b.episode.tool_timeouts == 0
        hung = [t for t in threading.enumerate() if t.name == "env-step-call" and t.is_alive()]
        assert hung and all(t.daemon for t in hung)  # left running; never blocks the exit
    finally:
        release.set()


def test_a_step_that_raises_ends_only_its_trajectory():
    def broken(step):
        raise RuntimeError("tool bug")

    [[a], [b]] = run(Factory({0: (3, broken), 1: (2, None)}), Engine())
    assert a.episode.tool_errors == 1 and a.episode.turns == 1 and a.episode.tool_timeouts == 0
    assert b.episode.turns == 2 and b.episode.tool_errors == 0


@pytest.mark.parametrize("scheduling", ["async", "lockstep"])
def test_the_run_ending_mid_request_ends_it(scheduling):
    slow = lambda step: time.sleep(0.05)  # noqa: E731
    assert run(Factory({0: (3, slow), 1: (3, None)}), Engine(1), scheduling=scheduling) is None
    assert run(Factory({0: (3, None)}), Engine(0), scheduling=scheduling) is None


def test_per_tool_limits_bound_concurrent_calls_of_that_tool():
    running = {"slow": 0, "fast": 0}
    peak = {"slow": 0, "fast": 0, "all": 0}
    lock = threading.Lock()

    class ToolEnv:
        def __init__(self, tool):
            self.tool = tool

        def step(self, action):
            with lock:
                running[self.tool] += 1
                peak[self.tool] = max(peak[self.tool], running[self.tool])
                peak["all"] = max(peak["all"], sum(running.values()))
            time.sleep(0.1)
            with lock:
                running[self.tool] -= 1
            return StepResult(done=True)

    class ToolFactory:
        stop = ["\n"]
        tool_limits = {"slow": 1}

        def __call__(self, prompt):
            return ToolEnv(prompt.text)

    class CallEngine(Engine):  # each turn calls its prompt's tool
        def __call__(self, prompts, sampling, budgets):
            return [
                [Completion([ord(c) for c in f"<call>{tool} x</call>"], [0.0] * 17, "stop", 1)]
                for tool in ("slow", "slow", "fast", "fast")
            ]

    runner = EpisodeRunner(ToolFactory(), CharTokenizer(), EnvConfig(max_concurrent_steps=4))
    prompts = [Prompt(i, tool, "") for i, tool in enumerate(["slow", "slow", "fast", "fast"])]
    runner.run(prompts, [[1000 + i] for i in range(4)], SamplingParams(), CallEngine())
    assert peak["slow"] == 1 and peak["fast"] == 2 and peak["all"] == 3


def test_partial_rollouts_continue_an_aborted_turn_inside_the_scheduler():
    """A turn a weight update aborted is continued by ``RolloutLoop._complete`` before the
    scheduler sees it: the trajectory holds the whole turn, each token with its version."""
    calls = []

    def generate_on(worker, prompts, sampling, seed, budgets):
        calls.append((prompts, seed))
        if len(calls) == 2:  # the second turn: aborted after one token, at version 1
            return [[Completion([ord("g")], [-0.5], "abort", 1)] for _ in prompts]
        tail = [ord("\n")] if len(calls) == 3 else [ord(c) for c in TURN]
        return [[Completion(tail, [-0.5] * len(tail), "stop", 2)] for _ in prompts]

    loop = RolloutLoop(
        0,
        generate_on,
        lambda *a: [],
        RolloutGate(abort=lambda: None, partial=True),
        StreamingBuffer(1, 1, 1),
        queue.Queue(),
        queue.Queue(),
        SamplingParams(max_new_tokens=8),
        seed=7,
        greedy_baseline=False,
        partial=True,
        on_failure=lambda exc: None,
    )
    runner = EpisodeRunner(Factory({0: (2, None)}), CharTokenizer(), EnvConfig())
    [[c]] = runner.run(
        [Prompt(0, "q", "1")], [[1000]], SamplingParams(max_new_tokens=8), loop._complete
    )
    turn, obs = [ord(c) for c in TURN], [ord(c) for c in OBSERVATION]
    assert c.token_ids == turn + obs + turn and c.episode.turns == 2
    assert c.token_versions == [2, 2, 2, 2, 1, 2]  # the continued turn: 1 then 2
    assert c.mask == [1, 1, 0, 0, 1, 1]
    assert calls[2][0] == [[1000, *turn, *obs, ord("g")]]  # continued from its prefix
    assert [seed for _, seed in calls] == [8, 9, 10] and loop.continued == 1


def test_scheduling_config_is_validated():
    with pytest.raises(ConfigError, match="task.env.scheduling"):
        EnvConfig(scheduling="eager")
    with pytest.raises(ConfigError, match="task.env.max_concurrent_steps"):
        EnvConfig(max_concurrent_steps=0)
    with pytest.raises(ConfigError, match="task.env.step_timeout_s"):
        EnvConfig(step_timeout_s=0)
    with pytest.raises(ConfigError, match="task.env.batch_wait_s"):
        EnvConfig(batch_wait_s=-1)
