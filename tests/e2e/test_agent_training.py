"""Training through the agent endpoint (``task.env.name=openai_agent``): an agent loop written
with the real ``openai`` client runs against the endpoint in the driver, its calls go through
the real rollout workers, and the controller trains GRPO on the stitched trajectories with the
real learner for two steps. The test records what the engines returned (the rollout loops'
``generate_on``) and what the learner was handed (``train_step``'s batch) and requires every
trained token to be one the engine generated, in the context it generated it, with its logprob.
"""

from __future__ import annotations

import math

import numpy as np

from rlsys.types import Completion, TrainBatch

BATCH, N = 4, 2  # data.batch_size prompts x rollout.n_samples trajectories per step
RUN = [
    "algorithm=grpo",
    "task.env.name=openai_agent",
    # below; importable by that name as pytest puts tests/e2e on sys.path (cf. test_learning)
    "task.env.agent=test_agent_training:two_call_agent",
    "task.chat_template=true",  # the built-in tokenizer's template (rlsys/models/builtin.py)
    "task.reward=env",  # the agent's return
    "task.max_new_tokens=8",  # per call
    "task.env.max_total_tokens=64",  # both replies and the follow-up turn the template writes
    "task.eval_size=4",
    "eval.num_prompts=1",  # the evaluations before and after run the agent too: kept short
    "sft.eval_prompts=1",
    "warm_start.enabled=false",
    "trainer.total_steps=2",
    "trainer.eval_every=0",
    f"data.batch_size={BATCH}",
    f"rollout.n_samples={N}",
    "algorithm.filter_uniform_groups=false",
    "checkpoint.every=0",
    "learner.world_size=1",  # the agent and its endpoint are the subject, not the sharding
]


def two_call_agent(client, prompt) -> float:
    """Ask the question, then send the conversation on with a follow-up and ask again; the
    reward is the share of digits in the two replies (a score an untrained model varies on)."""
    messages = [{"role": "user", "content": prompt.text}]
    replies = []
    for follow_up in ("Sure?", None):
        reply = client.chat.completions.create(model="policy", messages=messages)
        message = reply.choices[0].message
        replies.append(message.content or "")
        messages.append(message.model_dump(exclude_none=True))
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    text = "".join(replies)
    return sum(c.isdigit() for c in text) / max(1, len(text))


class Recorder:
    """A ``run_controller`` ``before`` hook that records, on the driver, each (prompt ids,
    completion) the rollout workers return and each batch handed to the learner; both pass on
    unchanged."""

    def __init__(self) -> None:
        self.engine_calls: list[tuple[list[int], Completion]] = []
        self.batches: list[TrainBatch] = []
        self.specials: set[int] = set()

    def __call__(self, cfg, pools, tokenizer, task) -> None:
        generate_on, train_step = pools.rollout.generate_on, pools.learner.train_step

        def recorded_generate_on(worker, prompts, sampling, seed=None, budgets=None):
            out = generate_on(worker, prompts, sampling, seed, budgets)
            calls = [(list(p), c) for p, group in zip(prompts, out, strict=True) for c in group]
            self.engine_calls.extend(calls)
            return out

        def recorded_train_step(batch, *args, **kwargs):
            self.batches.append(batch)
            return train_step(batch, *args, **kwargs)

        pools.rollout.generate_on = recorded_generate_on
        pools.learner.train_step = recorded_train_step
        self.specials.update(tokenizer.all_special_ids)


def trained_runs(batch, row: int) -> list[tuple[list[int], list[int], np.ndarray]]:
    """(context ids, trained ids, their behaviour logprobs) of each run of consecutive trained
    tokens of ``row`` (``loss_mask`` column j is the target ``input_ids`` column j + 1)."""
    ids, attention = batch.input_ids[row], batch.attention_mask[row]
    start = int(np.argmax(attention))  # prompts are left-padded
    mask = np.concatenate([[0.0], batch.loss_mask[row]]) > 0  # per input_ids column
    runs, t = [], 0
    while t < len(ids):
        if not mask[t]:
            t += 1
            continue
        end = t
        while end < len(ids) and mask[end]:
            end += 1
        lps = batch.behaviour_logprobs[row, t - 1 : end - 1]
        runs.append((ids[start:t].tolist(), ids[t:end].tolist(), lps))
        t = end
    return runs


def engine_produced(run, engine_calls, specials: set[int]) -> bool:
    """Whether an engine call had exactly this context as its prompt and generated these ids
    (then, at most, trailing special tokens the chat template replaced) with these logprobs."""
    context, tokens, lps = run
    for prompt, c in engine_calls:
        if prompt != context or c.token_ids[: len(tokens)] != tokens:
            continue
        rest = c.token_ids[len(tokens) :]
        same_lps = np.array_equal(np.float32(c.logprobs[: len(tokens)]), lps)
        if same_lps and set(rest) <= specials:
            return True
    return False


def test_an_openai_client_agent_trains_through_the_endpoint(run_controller):
    recorder = Recorder()
    summary, steps = run_controller(RUN, before=recorder)

    # the learner trained on the agents' trajectories: two GRPO steps, every sample counted
    assert summary["steps"] == 2 and summary["samples"] == 2 * BATCH * N
    assert summary["policy_version"] == 2 and summary["reward_errors"] == 0
    for record in steps:
        for key in ("train/loss", "train/entropy", "train/grad_norm"):
            assert math.isfinite(record[key])
        assert record["reward/env"] == record["rollout/reward_mean"]
        assert record["env/agent_error_frac"] == 0.0  # no agent raised or timed out
        assert 1.0 <= record["env/turns"] <= 2.0
    assert any(record["train/grad_norm"] > 0 for record in steps)

    # every trained token is what an engine generated, in the context it was generated in
    batches, engine_calls = recorder.batches, recorder.engine_calls
    assert len(batches) == 2 and all(len(b) == BATCH * N for b in batches)
    assert len(engine_calls) == 2 * 2 * BATCH * N  # two calls per trajectory
    multi_call = 0
    for batch in batches:
        for row in range(len(batch)):
            runs = trained_runs(batch, row)
            assert runs, "a trajectory with no trained token"
            for run in runs:
                assert engine_produced(run, engine_calls, recorder.specials), (
                    f"row {row}: trained ids {run[1]} after a context of {len(run[0])} ids are "
                    "not an engine call's generation"
                )
            multi_call += len(runs) > 1
    assert multi_call > 0  # both calls of a conversation trained, the follow-up between masked
