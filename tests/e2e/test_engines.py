"""Both rollout engines, each in a real rollout worker actor: the RolloutEngine contract.

Behaviour logprobs equal a forward pass at the sampling temperature (tree rollouts too: leaves
carry their shared prefix's tokens and logprobs); seeds reproduce; stop
tokens and strings end completions; versions are stamped; a weight update changes what is
generated (greedy output equals Hugging Face's greedy output for the new weights); abort stops
an in-flight generation with partial completions; sleep/wake keep the engine usable.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import ray
import torch

from rlsys.config.schema import ModelConfig, RolloutConfig, WeightSyncConfig
from rlsys.config.tree import TreeConfig
from rlsys.data.collate import pack
from rlsys.models.loading import load_model, load_tokenizer, resolve_model_path
from rlsys.models.logprobs import token_logprobs
from rlsys.pipeline.iid_tree import sample_iid_tree
from rlsys.pipeline.tree import generated_tokens, sample_tree
from rlsys.types import Completion, Prompt, RolloutGroup, Sample, SamplingParams
from rlsys.weight_sync import TRANSPORTS
from rlsys.weight_sync.base import SendResult, SyncAddress, WeightUpdate
from rlsys.weight_sync.object_store import encode
from rlsys.workers.rollout import RolloutWorker

ENGINES = ["hf", "vllm"]


@pytest.fixture(scope="module", params=ENGINES)
def worker(request, ray_cpu, tiny_model_dir):
    cfg = RolloutConfig(engine=request.param, num_cpus_per_worker=1)
    actor = RolloutWorker.options(num_cpus=1, max_concurrency=2).remote(
        cfg, tiny_model_dir, "float32", 1, 0.0
    )
    transport = TRANSPORTS.get("object_store")(WeightSyncConfig())
    ray.get(actor.connect_weight_sync.remote(transport, 1, 2, SyncAddress("127.0.0.1", 0)))
    yield request.param, actor
    ray.kill(actor)


def _generate(actor, prompts, **sampling):
    return ray.get(actor.generate.remote(prompts, SamplingParams(**sampling)))


def _prompts(tok):
    return [tok.encode(t, add_special_tokens=False) for t in ["1+2=", "33+44=", "7+8="]]


def test_behaviour_logprobs_match_a_forward_pass(worker, tiny_model_dir):
    name, actor = worker
    tok = load_tokenizer(tiny_model_dir)
    prompts = _prompts(tok)
    groups = _generate(actor, prompts, n=3, temperature=0.7, max_new_tokens=6, seed=1)
    flat = [c for g in groups for c in g]
    assert [len(g) for g in groups] == [3, 3, 3]
    assert all(len(c.token_ids) == len(c.logprobs) > 0 for c in flat)
    batch = pack(
        [p for p in prompts for _ in range(3)],
        [c.token_ids for c in flat],
        tok.pad_token_id,
        [c.logprobs for c in flat],
    )
    model = load_model(tiny_model_dir)
    with torch.no_grad():
        logp, _ = token_logprobs(
            model,
            torch.from_numpy(batch.input_ids),
            torch.from_numpy(batch.attention_mask),
            temperature=0.7,
        )
    mask = batch.loss_mask > 0
    np.testing.assert_allclose(logp.numpy()[mask], batch.behaviour_logprobs[mask], atol=2e-3)


def test_top_logprobs_rank_the_likeliest_tokens(worker, tiny_model_dir):
    """``SamplingParams.top_logprobs=k``: k (token, logprob) pairs per position, most likely
    first, on the same scale as the sampled token's behaviour logprob."""
    _, actor = worker
    tok = load_tokenizer(tiny_model_dir)
    groups = _generate(actor, _prompts(tok), n=2, temperature=0.7, max_new_tokens=6, seed=3)
    assert all(c.top_logprobs is None for g in groups for c in g)  # not asked: not returned
    groups = _generate(
        actor, _prompts(tok), n=2, temperature=0.7, max_new_tokens=6, seed=3, top_logprobs=3
    )
    seen = 0
    for c in (c for g in groups for c in g):
        assert len(c.top_logprobs) == len(c.token_ids) > 0
        for token, logprob, top in zip(c.token_ids, c.logprobs, c.top_logprobs, strict=True):
            assert len(top) == 3
            ranked = [lp for _, lp in top]
            assert ranked == sorted(ranked, reverse=True)
            if token in dict(top):
                seen += 1
                assert dict(top)[token] == pytest.approx(logprob, abs=1e-4)
            else:  # a token outside the top 3 is less likely than all of them
                assert logprob <= ranked[-1] + 1e-4
    assert seen > 0


@pytest.mark.parametrize("mode", ["fixed", "iid"])
def test_tree_rollouts_share_prefixes_and_keep_exact_logprobs(worker, tiny_model_dir, mode):
    """Tree rollouts through the engine's prefix continuation (before any weight update: the
    forward pass is of the starting weights), TreePO's fixed segments and the shared
    prefixes of independent replies (``iid``): leaves below a node share its tokens, and
    every leaf's logprobs, the copied shared ones included, equal a forward pass."""
    _, actor = worker
    tok = load_tokenizer(tiny_model_dir)
    prompts = _prompts(tok)[:2]
    sampling = SamplingParams(n=4, temperature=0.7, max_new_tokens=6, seed=2, stop_token_ids=[])
    calls = iter(range(100))

    def complete(ids, params, budgets):
        seeded = dataclasses.replace(params, seed=next(calls))
        return ray.get(actor.generate.remote(ids, seeded, budgets))

    if mode == "fixed":
        tree = TreeConfig(enabled=True, branching=2, segment_tokens=2)
        groups = sample_tree(prompts, sampling, tree, complete)
    else:
        ends = {tok.eos_token_id}
        uniform = np.random.default_rng(0).random
        groups = sample_iid_tree(prompts, sampling, 20, ends, complete, uniform)
    flat = [c for g in groups for c in g]
    assert [len(g) for g in groups] == [4, 4]
    for group in groups:
        by_node: dict[int, set] = {}
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) == sum(n for _, n in c.segments)
            start = 0
            for node, n in c.segments:
                by_node.setdefault(node, set()).add(tuple(c.token_ids[start : start + n]))
                start += n
        assert all(len(tokens) == 1 for tokens in by_node.values())  # one segment per node
        made = generated_tokens(RolloutGroup(None, [_sample(c) for c in group]))
        if mode == "fixed":
            assert made < sum(len(c.token_ids) for c in group)
        else:  # each distinct prefix once: the trie of the replies (shared only by chance)
            trie = {tuple(c.token_ids[:k]) for c in group for k in range(1, len(c.token_ids) + 1)}
            assert made == len(trie)
    batch = pack(
        [p for p in prompts for _ in range(4)],
        [c.token_ids for c in flat],
        tok.pad_token_id,
        [c.logprobs for c in flat],
    )
    with torch.no_grad():
        logp, _ = token_logprobs(
            load_model(tiny_model_dir),
            torch.from_numpy(batch.input_ids),
            torch.from_numpy(batch.attention_mask),
            temperature=0.7,
        )
    mask = batch.loss_mask > 0
    np.testing.assert_allclose(logp.numpy()[mask], batch.behaviour_logprobs[mask], atol=2e-3)


def _sample(completion: Completion) -> Sample:
    return Sample(Prompt(0, "", ""), [], completion, "")


def test_seeds_reproduce_and_samples_differ(worker, tiny_model_dir):
    _, actor = worker
    prompts = _prompts(load_tokenizer(tiny_model_dir))
    first = _generate(actor, prompts, n=4, max_new_tokens=8, seed=3)
    again = _generate(actor, prompts, n=4, max_new_tokens=8, seed=3)
    other = _generate(actor, prompts, n=4, max_new_tokens=8, seed=4)
    ids = [[c.token_ids for c in g] for g in first]
    assert ids == [[c.token_ids for c in g] for g in again]
    assert ids != [[c.token_ids for c in g] for g in other]
    assert all(len({tuple(t) for t in group}) > 1 for group in ids)  # n samples, not n copies


def test_stop_tokens_and_strings_end_completions(worker, tiny_model_dir):
    _, actor = worker
    tok = load_tokenizer(tiny_model_dir)
    prompts = _prompts(tok)
    free = _generate(actor, prompts, n=4, max_new_tokens=12, seed=5)
    # stop on whichever token the untrained model emitted third in its first sample
    stop_id = free[0][0].token_ids[2]
    stopped = _generate(actor, prompts, n=4, max_new_tokens=12, seed=5, stop_token_ids=[stop_id])
    first = stopped[0][0]
    assert first.token_ids[-1] == stop_id and first.finish_reason == "stop"
    assert len(first.token_ids) <= 3
    stop_text = tok.decode(free[1][0].token_ids[1:3])
    by_string = _generate(actor, prompts, n=4, max_new_tokens=12, seed=5, stop=[stop_text])
    text = tok.decode(by_string[1][0].token_ids)
    assert text.endswith(stop_text) and by_string[1][0].finish_reason == "stop"
    assert stop_text not in text[: -len(stop_text)]


def test_weight_update_stamps_versions_and_changes_greedy_output(worker, tiny_model_dir):
    name, actor = worker
    tok = load_tokenizer(tiny_model_dir)
    prompts = _prompts(tok)
    before = _generate(actor, prompts, n=1, greedy=True, max_new_tokens=8)
    model = load_model(tiny_model_dir)
    torch.manual_seed(7)
    new = {k: torch.randn_like(v) * 0.2 for k, v in model.state_dict().items()}
    model.load_state_dict(new)
    half = len(new) // 2
    names = list(new)
    buckets = [{k: new[k] for k in names[:half]}, {k: new[k] for k in names[half:]}]
    sent = SendResult(5, num_buckets=2, handle=[ray.put(encode(b)) for b in buckets])
    loaded = ray.get(actor.update_weights.remote(WeightUpdate(5, published=ray.put(sent))))
    assert loaded == len(new)
    assert ray.get(actor.version.remote()) == 5
    after = _generate(actor, prompts, n=1, greedy=True, max_new_tokens=8)
    assert all(g[0].version == 5 for g in after)
    assert [g[0].token_ids for g in after] != [g[0].token_ids for g in before]
    for prompt, group in zip(prompts, after, strict=True):
        reference = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=8,
            do_sample=False,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )[0, len(prompt) :].tolist()
        if tok.eos_token_id in reference:
            reference = reference[: reference.index(tok.eos_token_id) + 1]
        assert group[0].token_ids == reference, name


def test_abort_returns_partial_completions(worker, tiny_model_dir):
    _, actor = worker
    prompts = _prompts(load_tokenizer(tiny_model_dir)) * 40
    sampling = SamplingParams(n=8, max_new_tokens=200, seed=0, stop_token_ids=[])
    # a generation long enough to be in flight when abort arrives (on the actor's 2nd thread)
    pending = actor.generate.remote(prompts, sampling)
    time.sleep(1.5)
    ray.get(actor.abort.remote())
    groups = ray.get(pending, timeout=120)
    flat = [c for g in groups for c in g]
    assert len(flat) == len(prompts) * 8
    aborted = [c for c in flat if c.finish_reason == "abort"]
    assert aborted, "abort() did not stop the in-flight generation"
    assert all(len(c.token_ids) < 200 and len(c.token_ids) == len(c.logprobs) for c in aborted)
    # the engine serves the next request normally
    after = _generate(actor, prompts[:2], n=2, max_new_tokens=4, seed=1)
    assert all(c.finish_reason in ("stop", "length") for g in after for c in g)


def test_sleep_and_wake_keep_the_engine_usable(worker, tiny_model_dir):
    _, actor = worker
    prompts = _prompts(load_tokenizer(tiny_model_dir))
    before = _generate(actor, prompts, n=1, greedy=True, max_new_tokens=6)
    ray.get(actor.sleep.remote())
    ray.get(actor.wake.remote())
    assert _generate(actor, prompts, n=1, greedy=True, max_new_tokens=6) == before


def test_hf_engine_sleep_gives_its_weights_memory_back(ray_cpu):
    """On CPU the HF engine's sleep parks its weights in a file: the worker process's resident
    memory drops by at least their bytes, and after wake greedy output is unchanged. The model
    is 52 MB, so allocator noise (tens of KB) is small beside the comparison."""
    model_dir = resolve_model_path(
        ModelConfig(
            hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2, intermediate_size=1536
        )
    )
    weight_bytes = sum(p.numel() * p.element_size() for p in load_model(model_dir).parameters())
    actor = RolloutWorker.options(num_cpus=1).remote(
        RolloutConfig(engine="hf"), model_dir, "float32", 1, 0.0
    )
    try:
        prompts = _prompts(load_tokenizer(model_dir))
        before = _generate(actor, prompts, n=1, greedy=True, max_new_tokens=8)
        slept = ray.get(actor.sleep.remote())
        assert slept["freed_bytes"] == weight_bytes
        assert slept["rss_drop_bytes"] >= weight_bytes, (slept, weight_bytes)
        with pytest.raises(RuntimeError, match="call wake"):
            _generate(actor, prompts, n=1, greedy=True, max_new_tokens=8)
        woke = ray.get(actor.wake.remote())
        assert woke["wakes"] == 1 and woke["taken_bytes"] >= weight_bytes, (woke, weight_bytes)
        assert _generate(actor, prompts, n=1, greedy=True, max_new_tokens=8) == before
    finally:
        ray.kill(actor)
