"""Per-step metrics of scored samples beyond the basics: reward components, multi-turn
episodes and their step groups, tree rollouts' token savings (the controller logs them with its rollout metrics); rows of the sample tables."""

from __future__ import annotations

from collections import Counter

import numpy as np

from rlsys.pipeline.tree import generated_tokens
from rlsys.types import RolloutGroup, Sample


def reward_component_metrics(samples: list[Sample]) -> dict[str, float]:
    """``reward/<name>``: the mean unweighted value of every reward component."""
    names = {name for s in samples for name in s.reward_components}
    return {
        f"reward/{name}": float(np.mean([s.reward_components.get(name, 0.0) for s in samples]))
        for name in sorted(names)
    }


def episode_metrics(samples: list[Sample]) -> dict[str, float]:
    """``env/*``: turns, tool calls and errors, truncation and the environment's reward per
    trajectory; the share of trajectories with a well-formed call answered; seconds per
    environment step and the share of step time that overlapped generation (multi-turn tasks
    only)."""
    episodes = [s.completion.episode for s in samples if s.completion.episode is not None]
    if not episodes:
        return {}
    trained = sum(sum(s.completion.trained()) for s in samples)
    total = sum(len(s.completion.token_ids) for s in samples)
    steps = sum(e.turns for e in episodes)  # one environment step per model turn
    tool_s = sum(e.tool_s for e in episodes)
    overlap_s = sum(e.tool_overlap_s for e in episodes)
    return {
        "env/turns": float(np.mean([e.turns for e in episodes])),
        "env/tool_calls": float(np.mean([e.tool_calls for e in episodes])),
        "env/tool_errors": float(np.mean([e.tool_errors for e in episodes])),
        "env/called_frac": float(np.mean([e.tool_calls > 0 for e in episodes])),
        "env/truncated_frac": float(np.mean([e.truncated for e in episodes])),
        "env/reward": float(np.mean([e.reward for e in episodes])),
        "env/model_token_frac": trained / total if total else 0.0,
        "env/tool_timeouts": float(np.mean([e.tool_timeouts for e in episodes])),
        "env/tool_s": tool_s / steps if steps else 0.0,
        "env/tool_overlap_frac": overlap_s / tool_s if tool_s else 0.0,
        "env/dropped_calls": float(np.mean([e.dropped_calls for e in episodes])),
        "env/agent_error_frac": float(np.mean([e.agent_error for e in episodes])),
    }


def tree_metrics(groups: list[RolloutGroup]) -> dict[str, float]:
    """``rollout/tokens_saved_frac``: 1 - tokens the engines generated for ``groups`` / the
    tokens a flat group of the same replies would have generated (tree rollouts only)."""
    if not any(s.completion.segments for g in groups for s in g.samples):
        return {}
    flat = sum(len(s.completion.token_ids) for g in groups for s in g.samples)
    generated = sum(generated_tokens(g) for g in groups)
    return {"rollout/tokens_saved_frac": 1.0 - generated / flat if flat else 0.0}


def step_group_metrics(groups: list[RolloutGroup]) -> dict[str, float]:
    """``env/step_group_size``: the mean, over model turns, of the number of turns of its
    group that acted on the same state (anchor state, ``Turn.state``: GiGPO's step group);
    ``env/shared_state_frac``: the share of turns after a trajectory's first whose step group
    holds another turn (the first turns all share the prompt). Multi-turn tasks only."""
    sizes: list[int] = []
    shared: list[bool] = []
    for group in groups:
        rows = [s.completion.turns or [] for s in group.samples]
        counts = Counter(t.state for row in rows for t in row)
        for row in rows:
            sizes += [counts[t.state] for t in row]
            shared += [counts[t.state] > 1 for t in row[1:]]
    if not sizes:
        return {}
    return {
        "env/step_group_size": float(np.mean(sizes)),
        "env/shared_state_frac": float(np.mean(shared)) if shared else 0.0,
    }


def sample_rows(groups: list[RolloutGroup], rows: int) -> list[dict]:
    """Up to ``rows`` samples for a sample table, one per group in order (then a second one
    per group, ...): the prompt, its answer, the decoded response, reward and verdict."""
    picked: list[Sample] = []
    for depth in range(max((len(g.samples) for g in groups), default=0)):
        if len(picked) >= rows:
            break
        picked += [g.samples[depth] for g in groups if depth < len(g.samples)]
    return [
        {
            "prompt": s.prompt.text,
            "answer": s.prompt.answer,
            "response": s.text,
            "reward": float(s.reward),
            "correct": bool(s.correct),
        }
        for s in picked[:rows]
    ]
