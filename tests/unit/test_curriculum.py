"""The curriculum sampler (rlsys/data/curriculum.py): what it draws given its evidence, how
the evidence fades, that it resumes exactly, and the errors that name the key at fault."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from rlsys.config.data import CurriculumConfig, DataConfig
from rlsys.config.errors import ConfigError
from rlsys.data.curriculum import CurriculumSampler
from rlsys.data.sampler import PromptSampler, make_sampler
from rlsys.data.tasks import level
from rlsys.types import Completion, Prompt, RolloutGroup, Sample

N = 4  # samples per group


def _prompts(per_bucket: int = 50) -> list[Prompt]:
    return [
        Prompt(uid=b * per_bucket + i, text=f"{b}-{i}", answer="", meta={"level": name})
        for b, name in enumerate(["easy", "hard", "mid"])
        for i in range(per_bucket)
    ]


def _group(prompt: Prompt, right: int) -> RolloutGroup:
    samples = [
        Sample(prompt, [0], Completion([1], [0.0], "stop", 0), "", correct=k < right)
        for k in range(N)
    ]
    return RolloutGroup(prompt, samples)


def _sampler(prompts, **cfg) -> CurriculumSampler:
    return CurriculumSampler(prompts, 16, N, CurriculumConfig(bucket_key="level", **cfg), seed=3)


def _levels(batch: list[Prompt]) -> Counter:
    return Counter(p.meta["level"] for p in batch)


def _teach(sampler, prompts, rounds: int = 8) -> None:
    """Easy prompts always right, hard ones always wrong, mid ones half right."""
    right = {"easy": N, "hard": 0, "mid": N // 2}
    for _ in range(rounds):
        sampler.observe([_group(p, right[p.meta["level"]]) for p in prompts[::5]])


def test_draws_go_to_the_bucket_whose_groups_are_mixed():
    prompts = _prompts()
    sampler = _sampler(prompts, uniform_mix=0.0)
    _teach(sampler, prompts)
    drawn = Counter()
    for _ in range(20):
        drawn += _levels(sampler.next_batch())
    assert drawn["mid"] / sum(drawn.values()) > 0.8, drawn
    metrics = sampler.metrics()
    assert metrics["data/buckets_seen_frac"] == 1.0
    assert metrics["data/pass_rate_p10"] < 0.1 and metrics["data/pass_rate_p90"] > 0.9


def test_with_no_evidence_every_bucket_is_drawn_and_batches_hold_distinct_prompts():
    sampler = _sampler(_prompts())
    drawn = Counter()
    for _ in range(20):
        batch = sampler.next_batch()
        assert len({p.uid for p in batch}) == len(batch) == 16
        drawn += _levels(batch)
    assert all(count > 60 for count in drawn.values()), drawn  # ~107 each
    assert sampler.metrics() == {"data/buckets_seen_frac": 0.0}


def test_the_uniform_mix_keeps_drawing_buckets_the_estimate_rules_out():
    prompts = _prompts()
    sampler = _sampler(prompts, uniform_mix=0.5)
    _teach(sampler, prompts)
    drawn = Counter()
    for _ in range(20):
        drawn += _levels(sampler.next_batch())
    # half of each draw is uniform: each third of the prompts gets at least ~1/6 of it
    assert drawn["easy"] > 30 and drawn["hard"] > 30, drawn


def test_sharpness_concentrates_the_draw_on_the_likeliest_mixed_bucket():
    # easy: 3 of 4 right (a mixed group ~0.68 of the time), mid: 2 of 4 (~0.88), hard: none
    right = {"easy": N - 1, "hard": 0, "mid": N // 2}
    prompts = _prompts()
    shares = {}
    for sharpness in (1.0, 4.0):
        sampler = _sampler(prompts, uniform_mix=0.0, sharpness=sharpness, memory_groups=64)
        for _ in range(8):
            sampler.observe([_group(p, right[p.meta["level"]]) for p in prompts[::5]])
        drawn = Counter()
        for _ in range(40):
            drawn += _levels(sampler.next_batch())
        shares[sharpness] = drawn["mid"] / sum(drawn.values())
        assert drawn["hard"] < 0.05 * sum(drawn.values()), (sharpness, drawn)
    assert shares[4.0] > shares[1.0] + 0.05, shares
    with pytest.raises(ConfigError, match="data.curriculum.sharpness"):
        DataConfig(curriculum=CurriculumConfig(sharpness=0))


def test_old_evidence_fades_so_the_estimate_follows_the_policy():
    prompts = _prompts()
    sampler = _sampler(prompts, memory_groups=4)
    hard = [p for p in prompts if p.meta["level"] == "hard"]
    for _ in range(10):
        sampler.observe([_group(p, 0) for p in hard[:5]])
    for _ in range(10):  # the policy learned the hard bucket
        sampler.observe([_group(p, N) for p in hard[:5]])
    bucket = sampler.bucket_names.index("hard")
    # a group's weight is (1 - 1/4) per newer group: 50 newer groups leave ~1e-6 of it
    assert sampler.wrong[bucket] < 1e-3 * sampler.right[bucket]


def test_observe_does_not_depend_on_the_order_of_groups():
    prompts = _prompts()
    groups = [_group(p, i % (N + 1)) for i, p in enumerate(prompts)]
    a, b = _sampler(prompts), _sampler(prompts)
    a.observe(groups)
    b.observe(groups[::-1])
    assert a.state_dict() == b.state_dict()


def test_state_round_trips_through_json_and_draws_continue_identically():
    prompts = _prompts()
    original = _sampler(prompts)
    _teach(original, prompts, rounds=3)
    original.next_batch()
    saved = json.loads(json.dumps(original.state_dict()))  # as trainer.json holds it
    resumed = _sampler(prompts)
    resumed.load_state_dict(saved)
    for _ in range(3):
        assert [p.uid for p in resumed.next_batch()] == [p.uid for p in original.next_batch()]


def test_each_prompt_is_its_own_bucket_without_a_key():
    prompts = _prompts(per_bucket=4)
    sampler = CurriculumSampler(prompts, 4, N, CurriculumConfig(uniform_mix=0.0), seed=0)
    assert len(sampler.bucket_names) == len(prompts)
    mixed = prompts[5]
    sampler.observe([_group(p, N if p is not mixed else N // 2) for p in prompts] * 10)
    picks = Counter(p.uid for _ in range(30) for p in sampler.next_batch(1))
    assert picks.most_common(1)[0][0] == mixed.uid


def test_errors_name_the_key_and_the_fix():
    with pytest.raises(ValueError, match="data.curriculum.bucket_key='difficulty'.*null"):
        CurriculumSampler(_prompts(), 8, N, CurriculumConfig(bucket_key="difficulty"), 0)
    with pytest.raises(ConfigError, match="data.curriculum.memory_groups"):
        DataConfig(curriculum=CurriculumConfig(memory_groups=0.5))
    with pytest.raises(ConfigError, match="data.sampler"):
        DataConfig(sampler="bandit")
    uniform = PromptSampler(_prompts(), 8, True, 0)
    curriculum = _sampler(_prompts())
    with pytest.raises(ValueError, match="data.sampler=uniform"):
        curriculum.load_state_dict(uniform.state_dict())
    with pytest.raises(ValueError, match="data.sampler=curriculum"):
        uniform.load_state_dict(curriculum.state_dict())


def test_make_sampler_builds_what_data_sampler_names():
    prompts = _prompts()
    assert isinstance(make_sampler(DataConfig(), prompts, N, 0), PromptSampler)
    built = make_sampler(DataConfig(sampler="curriculum"), prompts, N, 0)
    assert isinstance(built, CurriculumSampler) and built.n == N


@pytest.mark.parametrize(
    ("a", "op", "b", "expected"),
    [
        (12, "+", 13, "+0"),
        (99, "+", 1, "+2"),
        (35, "-", 17, "-1"),
        (1, "-", 100, "-2"),
        (12, "*", 30, "*2"),
        (7, "*", 40, "*1"),
    ],
)
def test_arithmetic_levels_count_carries_and_borrows(a, op, b, expected):
    assert level(a, op, b) == expected


def test_within_a_bucket_each_prompt_seen_before_goes_by_its_own_groups():
    # one bucket, right half the time on average: always-right and always-wrong prompts and
    # mixed ones; the bucket's estimate alone cannot tell them apart, the prompts' can
    prompts = [Prompt(uid=i, text=str(i), answer="", meta={"level": "one"}) for i in range(60)]
    right = [N] * 10 + [0] * 10 + [N // 2] * 10  # prompts 30-59 never seen
    sampler = CurriculumSampler(
        prompts, 8, N, CurriculumConfig(bucket_key="level", uniform_mix=0.0), seed=0
    )
    for _ in range(3):
        sampler.observe([_group(p, r) for p, r in zip(prompts[:30], right, strict=True)])
    drawn = Counter(p.uid // 10 for _ in range(40) for p in sampler.next_batch())
    per_uniform = (drawn[0] + drawn[1]) / 20  # draws per prompt, by kind
    assert drawn[2] / 10 > 2 * per_uniform, drawn  # the mixed ones
    # unseen ones take the bucket's estimate (about half right: mixed groups likely)
    assert sum(drawn[k] for k in range(3, 6)) / 30 > 2 * per_uniform, drawn
    # the prompts' evidence survives a checkpoint
    resumed = CurriculumSampler(
        prompts, 8, N, CurriculumConfig(bucket_key="level", uniform_mix=0.0), seed=0
    )
    resumed.load_state_dict(json.loads(json.dumps(sampler.state_dict())))
    assert [p.uid for p in resumed.next_batch()] == [p.uid for p in sampler.next_batch()]
    # null: the bucket's estimate alone, every prompt alike
    flat = CurriculumSampler(
        prompts,
        8,
        N,
        CurriculumConfig(bucket_key="level", uniform_mix=0.0, prompt_prior_samples=None),
        seed=0,
    )
    assert flat.prompt_counts is None and "prompts" not in flat.state_dict()


@pytest.mark.parametrize(
    ("score", "low_share"), [("pass_rate", (0.3, 0.5)), ("mixed_rate", (0.75, 1))]
)
def test_the_mixed_rate_score_sees_a_bucket_whose_prompts_are_all_or_nothing(score, low_share):
    """Bucket "split": half its prompts always right, half always wrong (pass rate 0.5, no
    group ever mixed); bucket "low": every prompt right once in 4 (pass rate 0.25, every
    group mixed). The pass-rate score prefers "split" (1 - p^4 - (1-p)^4: 0.88 against 0.68,
    so "low" gets about 44% of the draws), the mixed-rate score "low"."""
    prompts = [
        Prompt(uid=b * 40 + i, text="", answer="", meta={"level": name})
        for b, name in enumerate(["split", "low"])
        for i in range(40)
    ]
    sampler = _sampler(prompts, uniform_mix=0.0, prompt_prior_samples=None, score=score)
    right = {"split": lambda p: N * (p.uid % 2), "low": lambda p: 1}
    for _ in range(4):
        sampler.observe([_group(p, right[p.meta["level"]](p)) for p in prompts])
    drawn = Counter()
    for _ in range(40):
        drawn += _levels(sampler.next_batch())
    assert low_share[0] < drawn["low"] / sum(drawn.values()) < low_share[1], drawn
    state = json.loads(json.dumps(sampler.state_dict()))
    resumed = _sampler(prompts, uniform_mix=0.0, prompt_prior_samples=None, score=score)
    resumed.load_state_dict(state)
    assert [p.uid for p in resumed.next_batch()] == [p.uid for p in sampler.next_batch()]
