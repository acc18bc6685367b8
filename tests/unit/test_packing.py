"""learner.packing: the planner packs rows into bins of the padded length and keeps the
data-parallel plan's rules; packed forward passes give the unpacked path's log-probabilities,
entropies, values and gradients (built-in Qwen2 model, a tiny Llama, SDPA and eager); a
one-rank learner trains and scores the same packed as unpacked, in fewer micro-batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlsys.algorithms.objectives import PolicyObjective
from rlsys.algorithms.policy_losses import ClipSettings
from rlsys.backends import build_backend
from rlsys.backends.data_parallel import packed_forward_plan, padding_fraction, train_plan
from rlsys.backends.packing import PackInputs, first_fit_decreasing
from rlsys.config.learner import LearnerConfig, OptimConfig
from rlsys.data.collate import pack
from rlsys.models.loading import load_model, load_tokenizer
from rlsys.models.logprobs import first_scored, token_logprobs
from rlsys.models.packing import pack_rows, packed_token_logprobs, packed_token_values
from rlsys.models.value import ValueModel, token_values


def test_first_fit_decreasing_by_hand():
    # 7 opens bin 0 (1 left), 5 bin 1 (3 left), 3 fills bin 1, 2 and 2 open bin 2, 1 fills bin 0
    bins = first_fit_decreasing(np.array([5, 3, 7, 2, 2, 1]), 8)
    assert [b.tolist() for b in bins] == [[2, 5], [0, 1], [3, 4]]
    with pytest.raises(ValueError, match="learner.packing=false"):
        first_fit_decreasing(np.array([9]), 8)


def test_packed_forward_plan_keeps_the_data_parallel_rules():
    lengths = np.array([3, 9, 4, 10, 2, 2, 5, 8, 1, 7, 6])
    plans = [packed_forward_plan(PackInputs(lengths), 10, 3, rank, micro=2) for rank in range(3)]
    assert len({len(p) for p in plans}) == 1  # every rank the same number of micro-batches
    rows = np.concatenate([r for p in plans for r, _ in p])
    assert sorted(rows.tolist()) == list(range(11))  # every row once
    for rank, plan in enumerate(plans):
        share = set(np.array_split(np.arange(11), 3)[rank].tolist())
        for rows, packed in plan:
            assert set(rows.tolist()) <= share  # a rank packs its own rows only
            assert len(set(packed.tolist())) <= 2  # micro packed rows at most
            for k in set(packed.tolist()):
                assert lengths[rows[packed == k]].sum() <= 10  # a packed row's capacity
    again = packed_forward_plan(PackInputs(lengths), 10, 3, 1, micro=2)  # deterministic
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(again, plans[1], strict=True))
    # rank 0 needs two packed rows (6 + 6 > 10), rank 1 one: it gets an empty micro-batch
    assert [
        r.size for r, _ in packed_forward_plan(PackInputs(np.array([6, 6, 4])), 10, 2, 1, 1)
    ] == [1, 0]


def test_padding_fraction_by_hand():
    mask = np.zeros((3, 6), np.int64)
    for row, (start, end) in enumerate([(1, 4), (0, 5), (4, 6)]):  # 3, 5 and 2 real tokens
        mask[row, start:end] = 1
    packed = PackInputs(mask.sum(-1))
    assert padding_fraction(mask, 1, 2, None) == pytest.approx(1 - 10 / 18)
    assert padding_fraction(mask, 1, 2, packed) == 0.0  # rows 5 | 3 + 2
    # two ranks, micro 1: rank 0's rows (3, 5 tokens: 8 > 6) in two micro-batches, rank 1's
    # (2) in one: nothing padded; micro 2: rank 0's two packed rows are 5 long (3 + 2 pads)
    assert padding_fraction(mask, 2, 1, packed) == 0.0
    assert padding_fraction(mask, 2, 2, packed) == pytest.approx(1 - 10 / 12)


def test_packed_train_plan_keeps_pairs_and_token_counts():
    rng = np.random.default_rng(0)
    mask = (rng.random((12, 7)) < 0.6).astype(np.float32)
    lengths = rng.integers(2, 9, 12)
    for rank in range(2):
        plain = train_plan(mask, 2, rank, 3, micro=4, seed=1, group=2)
        packed = train_plan(mask, 2, rank, 3, 4, 1, group=2, pack=PackInputs(lengths))
        assert [p.global_tokens for p in packed] == [p.global_tokens for p in plain]
        for a, b in zip(plain, packed, strict=True):
            assert sorted(np.concatenate(a.micro_batches)) == sorted(
                np.concatenate(b.micro_batches)
            )
            for rows, rows_packed in zip(b.micro_batches, b.packed_rows, strict=True):
                pairs = rows.reshape(-1, 2)
                assert (pairs[:, 0] % 2 == 0).all() and (pairs[:, 1] == pairs[:, 0] + 1).all()
                assert set(rows_packed.tolist()) <= {0, 1}  # micro // group packed rows
                for k in set(rows_packed.tolist()):  # group x padded length a packed row
                    assert lengths[rows[rows_packed == k]].sum() <= 2 * 8
    counts = {
        len(p.micro_batches)
        for r in range(2)
        for p in train_plan(mask, 2, r, 1, 2, 0, pack=PackInputs(lengths))
    }
    assert len(counts) == 1


def _rows(seed: int = 0, vocab: int = 90):
    """Five left/right-padded rows of mixed lengths, and a loss mask on their later tokens."""
    spans = [(2, 10), (0, 12), (5, 9), (3, 12), (1, 4)]
    ids = torch.randint(3, vocab, (5, 12), generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros(5, 12, dtype=torch.long)
    loss = torch.zeros(5, 11)
    for b, (start, end) in enumerate(spans):
        mask[b, start:end] = 1
        loss[b, start + 1 : end - 1] = 1
    return ids * mask, mask, loss


def test_pack_rows_layout():
    ids, mask, _ = _rows()
    packed = pack_rows(ids, mask, torch.tensor([0, 1, 0, 2, 2]))
    assert packed.input_ids.shape == (3, 12)  # row 0: 8 + 4 tokens; row 1: 12; row 2: 9 + 3
    assert packed.position_ids[0].tolist() == [*range(8), *range(4)]
    assert packed.position_ids[2].tolist() == [*range(9), *range(3)]  # padding restarts too
    assert packed.input_ids[0, 8:].tolist() == ids[2, 5:9].tolist()
    causal = torch.ones(12, 12).tril().bool()
    row0 = torch.zeros(12, 12, dtype=torch.bool)  # block-diagonal: 8 tokens, then 4
    row0[:8, :8], row0[8:, 8:] = causal[:8, :8], causal[:4, :4]
    assert torch.equal(packed.mask[0, 0], row0)  # causal within a sequence, none across
    assert torch.equal(packed.mask[1, 0], causal)  # one sequence of 12


def _tiny_llama(attn: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=90,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation=attn,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


@pytest.fixture(params=["builtin", "llama-sdpa", "llama-eager"])
def model(request, tiny_model_dir):
    if request.param == "builtin":
        return load_model(tiny_model_dir)
    return _tiny_llama(request.param.split("-")[1])


def _grads(model, logprobs, entropy, loss_mask):
    """Gradients of a seq-mean-token-mean loss with an entropy bonus."""
    per_seq = ((logprobs * 0.7 + 0.01 * entropy) * loss_mask).sum(-1) / loss_mask.sum(-1)
    model.zero_grad()
    per_seq.mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_packed_logprobs_and_gradients_equal_unpacked(model):
    ids, mask, loss = _rows()
    first = first_scored(loss)
    plain = token_logprobs(model, ids, mask, 0.8, first, entropy=True, entropy_grad=True)
    want = _grads(model, *plain, loss)
    packed_row = torch.tensor([0, 1, 0, 2, 2])
    got_lp = packed_token_logprobs(model, ids, mask, packed_row, 0.8, first, True, True, 7)
    got = _grads(model, *got_lp, loss)
    scored = loss > 0
    torch.testing.assert_close(got_lp[0][scored], plain[0][scored], atol=1e-6, rtol=0)
    torch.testing.assert_close(got_lp[1][scored], plain[1][scored], atol=1e-6, rtol=0)
    assert want.keys() == got.keys()
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, atol=1e-7, rtol=1e-5, msg=name)


def _grouped_rows(seed: int = 0, vocab: int = 90):
    """Six rows laid out as ``collate.pack`` does: prompts A (3 rows), B (2 rows, shorter:
    left-padded) and C, replies of 1-5 tokens, the loss on the replies."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 3, 4)]
    replies = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (3, 5, 1, 4, 2, 3)]
    batch = pack([prompts[k] for k in (0, 0, 0, 1, 1, 2)], replies, 0)
    tensors = (batch.input_ids, batch.attention_mask, batch.loss_mask)
    return tuple(torch.from_numpy(x) for x in tensors)


def test_pack_rows_shares_a_prompt_within_a_packed_row():
    ids, mask, loss = _grouped_rows()
    first = first_scored(loss)  # 4: the prompts end in column 4
    packed = pack_rows(ids, mask, torch.tensor([0, 0, 0, 1, 1, 0]), share_until=first)
    # row 0: A (5) + 3, then rows 1 and 2's replies (5, 1), then C's 4 + 3; row 1: B + 4, + 2
    assert packed.input_ids.shape == (2, 5 + 3 + 5 + 1 + 4 + 3)
    assert packed.position_ids[0, :14].tolist() == [*range(8), *range(5, 10), 5]
    assert packed.position_ids[1, :9].tolist() == [*range(7), 3, 4]
    # row 1's second reply token attends to A's prompt and its own first token only
    allowed = packed.mask[0, 0, 9].nonzero().flatten().tolist()
    assert allowed == [0, 1, 2, 3, 4, 8, 9]
    # the shared tokens are read where the owner holds them
    assert packed.index[1, :5].tolist() == packed.index[0, :5].tolist()
    assert packed.index[2, :5].tolist() == [0, 1, 2, 3, 4]


def test_shared_prompt_logprobs_and_gradients_equal_unpacked(model):
    ids, mask, loss = _grouped_rows(1)
    first = first_scored(loss)
    plain = token_logprobs(model, ids, mask, 0.8, first, entropy=True, entropy_grad=True)
    want = _grads(model, *plain, loss)
    packed_row = torch.tensor([0, 1, 0, 1, 1, 0])  # A's rows split over two packed rows
    got_lp = packed_token_logprobs(
        model, ids, mask, packed_row, 0.8, first, True, True, 5, share_until=first
    )
    got = _grads(model, *got_lp, loss)
    scored = loss > 0
    torch.testing.assert_close(got_lp[0][scored], plain[0][scored], atol=1e-6, rtol=0)
    torch.testing.assert_close(got_lp[1][scored], plain[1][scored], atol=1e-6, rtol=0)
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, atol=1e-7, rtol=1e-5, msg=name)


def test_packed_critic_values_equal_unpacked(tiny_model_dir):
    critic = ValueModel(load_model(tiny_model_dir))
    torch.nn.init.normal_(critic.head.weight)  # a zero head would hide any difference
    ids, mask, loss = _rows(1)
    want = token_values(critic, ids, mask)
    got = packed_token_values(critic, ids, mask, torch.tensor([1, 0, 1, 2, 2]))
    torch.testing.assert_close(got[loss > 0], want[loss > 0], atol=1e-5, rtol=1e-6)
    ids, mask, loss = _grouped_rows(2)  # shared prompts
    want = token_values(critic, ids, mask)
    packed_row = torch.tensor([0, 0, 1, 1, 1, 0])
    got = packed_token_values(critic, ids, mask, packed_row, share_until=first_scored(loss))
    torch.testing.assert_close(got[loss > 0], want[loss > 0], atol=1e-5, rtol=1e-6)


def _recorded(backend) -> tuple[list, list]:
    """Lists the backend fills: one entry per backward pass, the gradients of every step."""
    calls, grads = [], []
    backward, step = backend._backward, backend._step

    def counted(loss, boundary):
        calls.append(1)
        backward(loss, boundary)

    def recorded(lr):
        grads.append({n: p.grad.clone() for n, p in backend.module.named_parameters()})
        return step(lr)

    backend._backward, backend._step = counted, recorded
    return calls, grads


@pytest.mark.parametrize("prompts_per_batch", [12, 3], ids=["distinct", "groups-of-4"])
def test_a_packed_learner_trains_and_scores_like_an_unpacked_one(
    one_rank, tiny_model_dir, prompts_per_batch
):
    """Same log-probabilities, loss, entropy and gradients; fewer micro-batches; with groups
    of samples (``learner.share_prompts``) fewer tokens through the model."""
    tok = load_tokenizer(tiny_model_dir)
    rng = np.random.default_rng(0)
    distinct = [
        tok.encode(f"{a}*{b}=", add_special_tokens=False)
        for a, b in rng.integers(0, 9999, (prompts_per_batch, 2))
    ]
    prompts = [distinct[i * prompts_per_batch // 12] for i in range(12)]
    # mixed lengths: rows pack 2-3 a row; a group's replies shorter than its prompt
    most = 25 if prompts_per_batch == 12 else 8
    responses = [
        tok.encode("".join(rng.choice(list("0123456789"), n)), add_special_tokens=False)
        + [tok.eos_token_id]
        for n in rng.integers(1, most, len(prompts))
    ]
    batch = pack(prompts, responses, tok.pad_token_id)
    batch.old_logprobs = np.zeros_like(batch.loss_mask) - 3.0
    batch.advantages = rng.standard_normal(12).astype(np.float32)[:, None] * batch.loss_mask
    objective = PolicyObjective(
        loss_settings=ClipSettings(), loss_agg="seq_mean_token_mean", entropy_coef=0.01
    )
    length = batch.input_ids.shape[1]
    runs = []
    for packing, share in ((False, False), (True, False), (True, True)):
        cfg = LearnerConfig(
            world_size=1,
            micro_batch_size=2,
            max_tokens_per_micro_batch=2 * length,
            packing=packing,
            share_prompts=share,
            optim=OptimConfig(lr=1e-3, warmup_steps=0),
        )
        backend = build_backend(cfg, tiny_model_dir, "float32", 1.0, torch.device("cpu"))
        calls, grads = _recorded(backend)
        tokens = []
        backend.module.register_forward_pre_hook(
            lambda _, args, kwargs, seen=tokens: seen.append(kwargs["input_ids"].numel()),
            with_kwargs=True,
        )
        rows, logprobs = backend.forward_logprobs(batch)
        metrics = backend.train_step(batch, objective, num_mini_batches=1, epochs=1, seed=0)
        runs.append((rows, logprobs, metrics, grads, len(calls), sum(tokens)))
    rows, logprobs, metrics, grads, calls, tokens = runs[0]
    assert calls == 6
    scored = batch.loss_mask > 0
    for rows2, logprobs2, metrics2, grads2, _, _ in runs[1:]:
        order, order2 = np.argsort(rows), np.argsort(rows2)
        np.testing.assert_allclose(logprobs2[order2][scored], logprobs[order][scored], atol=1e-6)
        for key in ("loss", "entropy", "trained_tokens"):
            assert metrics2[key] == pytest.approx(metrics[key], rel=1e-5), key
        for name, grad in grads[0].items():
            torch.testing.assert_close(grads2[0][name], grad, atol=1e-7, rtol=1e-5, msg=name)
    packed_tokens, shared_tokens = runs[1][-1], runs[2][-1]
    if prompts_per_batch == 12:  # nothing to share
        assert runs[1][4] < calls
        assert shared_tokens == packed_tokens
    else:  # rows of equal length do not pack; groups sharing a prompt do
        assert runs[2][4] < calls
        assert shared_tokens < packed_tokens


def test_a_prompts_rows_share_a_packed_row():
    """The plans keep a prompt's rows in one packed row (longer than the padded length
    where needed) and count its tokens once."""
    ids = np.array([[0, 5, 6, 1, 2], [0, 5, 6, 3, 0], [7, 8, 9, 4, 0], [0, 5, 6, 2, 2]])
    mask = (ids > 0).astype(np.int64)
    mask[0, 0] = mask[1, 0] = mask[3, 0] = 0
    loss = np.zeros((4, 4), np.float32)
    loss[:, 2:] = mask[:, 3:]
    pack = PackInputs.of(ids, mask, loss, share_prompts=True)
    assert pack.prompts[0] == pack.prompts[1] == pack.prompts[3] != pack.prompts[2]
    assert pack.prompt_lengths.tolist() == [2, 2, 3, 2]
    assert pack.size(np.array([0, 1, 3])) == 2 + 2 + 1 + 2  # the prompt once
    ((rows, packed_row),) = packed_forward_plan(pack, 5, 1, 0, micro=4)
    together = {int(packed_row[rows == r][0]) for r in (0, 1, 3)}
    assert len(together) == 1
    assert PackInputs.of(ids, mask, loss, share_prompts=False).prompts is None
    # a prompt's rows beyond 4x its prompt (and the padded length) go to a second chunk
    long = PackInputs(np.full(6, 12), np.zeros(6, np.int64), np.full(6, 6))
    assert [u.tolist() for u in long.units(np.arange(6), 1, 18)] == [[0, 1, 2], [3, 4, 5]]
    # replies longer than their prompt: each row a unit of its own
    replies = PackInputs(np.full(3, 12), np.zeros(3, np.int64), np.full(3, 5))
    assert [u.tolist() for u in replies.units(np.arange(3), 1, 40)] == [[0], [1], [2]]
