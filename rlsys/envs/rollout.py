"""Multi-turn rollouts: model turns alternate with environment observations.

Every trajectory is one ``Completion`` whose tokens are the model's turns and the
observations between them, in order; ``mask`` is 0 on the observations so the loss skips
them, their behaviour logprobs are 0, and each token keeps the policy version that produced
it (observations take their turn's). The model's tokens are never re-tokenised: what the
learner trains on is exactly what the engine sampled (token in, token out). Trajectories
end when the environment says so, after ``task.env.max_turns`` model turns, or when the
next turn would have no room in ``max_total_tokens``.

Each model turn is also recorded as a ``Turn`` (its token span, its reward and the key of
the state it acted on), for step-level advantages (GiGPO). The key is the environment's
``state_key()`` where it defines one, else a digest of the observation tokens the trajectory
has seen so far: the first turn of every trajectory of a group acts on the same state (the
prompt alone), and later turns share a key when their observations so far are identical.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable

from rlsys.config.env import EnvConfig
from rlsys.envs.base import Environment, EnvironmentFactory, StepResult
from rlsys.types import Completion, Episode, Prompt, SamplingParams, Turn

log = logging.getLogger(__name__)
# (prompt ids, sampling, per-prompt budgets) -> completions per prompt; None: the run ends
Complete = Callable[
    [list[list[int]], SamplingParams, list[int] | None], list[list[Completion]] | None
]


@dataclasses.dataclass
class _Trajectory:
    env: Environment
    prompt_ids: list[int]
    budget: int  # response tokens in total
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    finish: str = "stop"
    episode: Episode = dataclasses.field(default_factory=Episode)
    turns: list[Turn] = dataclasses.field(default_factory=list)
    seen: str = ""  # digest of the observations so far: the default anchor-state key

    def completion(self) -> Completion:
        return Completion(
            self.tokens,
            self.logprobs,
            self.finish,
            min(self.versions) if self.versions else 0,
            self.versions,
            self.mask,
            self.episode,
            turns=self.turns,
        )


def _extend_digest(digest: str, observation: list[int]) -> str:
    """The state digest after ``observation`` (token ids) follows the state ``digest``."""
    data = f"{digest}|{','.join(map(str, observation))}".encode()
    return hashlib.blake2b(data, digest_size=12).hexdigest()


class EpisodeRunner:
    """Runs the environments of ``factory`` over a rollout engine's ``complete``."""

    def __init__(self, factory: EnvironmentFactory, tokenizer, cfg: EnvConfig) -> None:
        self.factory, self.tokenizer, self.cfg = factory, tokenizer, cfg
        self.stop = list(getattr(factory, "stop", []))
        self.end_ids = {tokenizer.eos_token_id}  # a turn ending in one ends the reply

    def total_tokens(self, turn_tokens: int) -> int:
        """A trajectory's response-token bound when one model turn may take ``turn_tokens``."""
        return self.cfg.max_total_tokens or turn_tokens * self.cfg.max_turns

    def run(
        self,
        prompts: list[Prompt],
        prompt_ids: list[list[int]],
        sampling: SamplingParams,
        complete: Complete,
    ) -> list[list[Completion]] | None:
        """``sampling.n`` trajectories per prompt; None if the run ends first. The first turn
        samples the n trajectories of a prompt together (one shared prompt); later turns
        continue each trajectory on its own. ``sampling.max_new_tokens`` bounds one turn."""
        turn_tokens = sampling.max_new_tokens
        total = self.total_tokens(turn_tokens)
        ends = self.end_ids | set(sampling.stop_token_ids)
        turn = dataclasses.replace(
            sampling,
            stop=list(dict.fromkeys([*sampling.stop, *self.stop])),
            max_new_tokens=min(turn_tokens, total),
        )
        first = complete(prompt_ids, turn, None)
        if first is None:
            return None
        trajectories = [
            [_Trajectory(self.factory(p), ids, total) for _ in group]
            for p, ids, group in zip(prompts, prompt_ids, first, strict=True)
        ]
        live = [
            t
            for row, group in zip(trajectories, first, strict=True)
            for t, c in zip(row, group, strict=True)
            if self._advance(t, c, ends)
        ]
        single = dataclasses.replace(turn, n=1)
        while live:
            budgets = [min(turn_tokens, t.budget - len(t.tokens)) for t in live]
            out = complete([t.prompt_ids + t.tokens for t in live], single, budgets)
            if out is None:
                return None
            live = [
                t for t, group in zip(live, out, strict=True) if self._advance(t, group[0], ends)
            ]
        return [[t.completion() for t in row] for row in trajectories]

    def _advance(self, t: _Trajectory, turn: Completion, ends: set[int]) -> bool:
        """Append a model turn and the environment's answer; whether the trajectory goes on.
        A turn whose last token is EOS (or a stop token) ends the reply; one that stopped at
        an environment stop string goes on (an engine may keep text after the match inside
        the matching token, so the ids decide, not the text)."""
        start, state = len(t.tokens), t.seen
        t.tokens += turn.token_ids
        t.logprobs += turn.logprobs
        t.mask += [1] * len(turn.token_ids)
        t.versions += turn.versions()
        t.finish = turn.finish_reason
        t.episode.turns += 1
        t.episode.truncated = turn.finish_reason == "length"  # cut by a token bound
        try:
            if hasattr(t.env, "state_key"):  # the environment's own anchor-state key
                state = str(t.env.state_key())
            result = t.env.step(self.tokenizer.decode(turn.token_ids, skip_special_tokens=True))
        except Exception as exc:  # noqa: BLE001 - an environment bug ends this trajectory only
            log.warning("environment step failed, trajectory ended: %r", exc)
            result = StepResult(done=True, tool_error=True)
        t.turns.append(Turn(start, len(t.tokens), result.reward, state))
        t.episode.reward += result.reward
        t.episode.tool_calls += int(result.tool_call)
        t.episode.tool_errors += int(result.tool_error)
        if result.correct is not None:
            t.episode.correct = result.correct
        if result.done:
            return False
        eos_ended = bool(turn.token_ids) and turn.token_ids[-1] in ends
        if eos_ended or result.observation is None:
            return False  # the model ended its reply; nothing more to say to it
        observation = self.tokenizer.encode(result.observation, add_special_tokens=False)
        observation = observation[: self.cfg.max_observation_tokens]
        room = t.budget - len(t.tokens) - len(observation)
        if t.episode.turns >= self.cfg.max_turns or room <= 0:
            t.episode.truncated = True
            t.finish = "length"  # cut by a bound: overlong filtering and stop_frac see it
            return False
        version = t.versions[-1] if t.versions else turn.version
        t.tokens += observation
        t.logprobs += [0.0] * len(observation)
        t.mask += [0] * len(observation)
        t.versions += [version] * len(observation)
        t.seen = _extend_digest(t.seen, observation)
        return True
