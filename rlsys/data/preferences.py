"""Preference pairs for ``rlsys rm`` and ``rlsys dpo``: read from a file or synthesised from
a task, and packed into learner batches whose rows 2i and 2i+1 are pair i's chosen and
rejected sequences.

Synthetic pairs (``preference.synthetic``) stand in for people comparing two replies:

* ``mistakes``: the task's reference answer chosen over a reply of the starting policy that
  the task's verifier marks wrong (the mistakes a reward model must catch when PPO samples
  that policy), or over a near miss for a prompt the policy always gets right.
* ``near_miss``: the reference answer over itself with one digit changed (two, a quarter of
  the time). The comparison needs the arithmetic, not the format: both replies look alike.
* ``ranked``: two of the starting policy's replies, the one the task's reward scores higher
  chosen (its best over its worst); a prompt whose replies all score the same gives no pair.
  This is how people label the SFT model's samples in InstructGPT, with the task's reward
  as the labeller; it suits graded rewards with no single right answer (``task=reviews``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from rlsys.config.errors import ConfigError
from rlsys.config.preference import PreferenceDataConfig
from rlsys.data.collate import pack
from rlsys.data.rows import read_rows
from rlsys.data.tasks import TaskSplits, hold_out
from rlsys.types import Prompt, Sample, TrainBatch

log = logging.getLogger(__name__)


@dataclass
class PreferencePair:
    """A prompt and two replies to it, ``chosen`` preferred over ``rejected``."""

    prompt: Prompt
    chosen: str
    rejected: str


@dataclass
class PreferenceSplits:
    """Training and held-out pairs."""

    train: list[PreferencePair]
    eval: list[PreferencePair]
    source: str  # the file, or "synthetic:<preference.synthetic>"
    skipped_rows: int = 0  # malformed rows (missing or empty columns, chosen == rejected)
    policy_pair_frac: float | None = None  # sampled synthetic pairs: made of policy replies

    def summary(self) -> dict:
        info = {
            "source": self.source,
            "train_pairs": len(self.train),
            "eval_pairs": len(self.eval),
            "skipped_malformed_rows": self.skipped_rows,
        }
        if self.policy_pair_frac is not None:
            info["policy_pair_frac"] = self.policy_pair_frac
        return info


def near_miss(answer: str, rng: np.random.Generator) -> str:
    """``answer`` with one of its digits changed (two, a quarter of the time)."""
    digits = [i for i, ch in enumerate(answer) if ch.isdigit()]
    if not digits:
        raise ValueError(
            f"synthetic preference pairs change a digit of the answer, and {answer!r} has "
            "none; give pairs in a file with preference.train_path"
        )
    chars = list(answer)
    count = 2 if len(digits) > 1 and rng.random() < 0.25 else 1
    for i in rng.choice(digits, size=count, replace=False):
        chars[i] = str((int(chars[i]) + int(rng.integers(1, 10))) % 10)
    return "".join(chars)


def mistake_pair(prompt: Prompt, replies: list[Sample], rng) -> tuple[str, str, bool]:
    """``mistakes`` / ``near_miss``: (reference answer, first wrong reply or a near miss,
    whether the rejected reply is the policy's)."""
    wrong = next((s.text for s in replies if not s.correct and s.text), None)
    if wrong is None:
        return prompt.answer, near_miss(prompt.answer, rng), False
    return prompt.answer, wrong, True


def ranked_pair(prompt: Prompt, replies: list[Sample], rng) -> tuple[str, str, bool] | None:
    """``ranked``: (the best-scored reply, the worst, True), or None when all score alike."""
    best = max(replies, key=lambda s: s.reward, default=None)
    worst = min(replies, key=lambda s: s.reward, default=None)
    if best is None or best.reward <= worst.reward or best.text == worst.text:
        return None
    return best.text, worst.text, True


def synthetic_pairs(
    task: TaskSplits, cfg: PreferenceDataConfig, seed: int, sample=None
) -> PreferenceSplits:
    """``cfg.synthetic_pairs`` training pairs over the task's train prompts and
    ``cfg.eval_size`` over its held-out prompts (``ranked``: fewer, by the prompts whose
    replies tied), made as ``cfg.synthetic`` says (see the module docstring) from the scored
    replies ``sample(prompts) -> [[Sample, ...] per prompt]`` gives."""
    rng = np.random.default_rng([seed, 7])
    make = ranked_pair if cfg.synthetic == "ranked" else mistake_pair
    counts = {"prompts": 0, "sampled_pairs": 0}

    def draw(prompts: list[Prompt], count: int) -> list[PreferencePair]:
        picks = [
            prompts[int(i)]
            for i in rng.choice(len(prompts), size=count, replace=count > len(prompts))
        ]
        replies = sample(picks) if sample is not None else [[] for _ in picks]
        pairs = []
        for prompt, group in zip(picks, replies, strict=True):
            made = make(prompt, group, rng)
            if made is not None:
                pairs.append(PreferencePair(prompt, made[0], made[1]))
                counts["sampled_pairs"] += made[2]
        counts["prompts"] += len(picks)
        return pairs

    train, evals = draw(task.train, cfg.synthetic_pairs), draw(task.eval, cfg.eval_size)
    if not train or not evals:
        raise ValueError(
            f"preference.synthetic={cfg.synthetic}: the starting model's replies to every "
            "prompt scored alike, so no pair could be ranked; sample more replies "
            "(preference.samples_per_prompt) or at a higher rollout.temperature"
        )
    splits = PreferenceSplits(train, evals, f"synthetic:{cfg.synthetic}")
    if sample is not None:  # the fraction of prompts whose pair is made of the policy's replies
        splits.policy_pair_frac = counts["sampled_pairs"] / max(1, counts["prompts"])
    return splits


def sample_replies(collector, sampling, seed: int):
    """``sample`` for ``synthetic_pairs``: ``sampling.n`` scored replies of the starting
    model per prompt, generated through ``collector`` (its rollout pool) 512 prompts at a
    time."""

    def sample(prompts: list[Prompt]) -> list[list[Sample]]:
        out: list[list[Sample]] = []
        chunk = 512
        for start in range(0, len(prompts), chunk):
            part = prompts[start : start + chunk]
            groups = collector.collect(part, sampling, seed + start)
            if len(groups) != len(part):
                raise ValueError(
                    f"{len(part) - len(groups)} of {len(part)} prompts were not sampled (over "
                    "task.max_prompt_tokens?); screen the task's prompts first"
                )
            out += [g.samples for g in groups]
        return out

    return sample


def _rows_to_pairs(rows: list[dict], cfg: PreferenceDataConfig, uid0: int):
    pairs, skipped = [], 0
    keys = (cfg.prompt_key, cfg.chosen_key, cfg.rejected_key)
    for row in rows:
        prompt, chosen, rejected = (row.get(k) for k in keys)
        if not all(isinstance(v, str) and v for v in (prompt, chosen, rejected)):
            skipped += 1
            continue
        if chosen == rejected:
            skipped += 1
            continue
        meta = {k: v for k, v in row.items() if k not in keys}
        pairs.append(PreferencePair(Prompt(uid0 + len(pairs), prompt, "", meta), chosen, rejected))
    return pairs, skipped


def file_pairs(cfg: PreferenceDataConfig, seed: int) -> PreferenceSplits:
    """Pairs from ``preference.train_path`` (and ``eval_path``, else held out of train)."""
    train, skipped = _rows_to_pairs(read_rows(cfg.train_path, "preference.train_path"), cfg, 0)
    if cfg.eval_path:
        rows = read_rows(cfg.eval_path, "preference.eval_path")
        evals, more = _rows_to_pairs(rows, cfg, len(train))
        skipped += more
    else:
        train, evals = hold_out(train, cfg.eval_size, seed)
    if skipped:
        log.warning(
            "skipped %d malformed preference rows (missing or empty %r, %r or %r, or chosen "
            "equal to rejected)",
            skipped,
            cfg.prompt_key,
            cfg.chosen_key,
            cfg.rejected_key,
        )
    if not train or not evals:
        raise ConfigError(
            f"preference.train_path={cfg.train_path!r} yielded no usable training or held-out "
            f"pairs; each row needs non-empty {cfg.prompt_key!r}, {cfg.chosen_key!r} and "
            f"{cfg.rejected_key!r} strings"
        )
    return PreferenceSplits(train, evals, cfg.train_path, skipped)


def load_pairs(
    cfg: PreferenceDataConfig, task: TaskSplits, seed: int, sample=None
) -> PreferenceSplits:
    """The pairs ``preference.*`` names: a file, else synthesised from ``task`` (from the
    starting model's replies, ``sample``, when ``preference.synthetic`` samples them)."""
    if cfg.train_path:
        return file_pairs(cfg, seed)
    return synthetic_pairs(task, cfg, seed, sample if cfg.samples_policy else None)


@dataclass
class PairBatch:
    """Packed pairs: ``batch`` rows 2i / 2i+1 are pair ``kept[i]``'s chosen / rejected."""

    batch: TrainBatch
    kept: list[PreferencePair]
    skipped_too_long: int

    def rows(self, pairs: np.ndarray) -> np.ndarray:
        """Row indices of pair indices ``pairs``, chosen before rejected."""
        return (np.asarray(pairs)[:, None] * 2 + np.arange(2)).reshape(-1)


def pack_pairs(pairs: list[PreferencePair], encode, pad_id: int, max_length: int) -> PairBatch:
    """Pack ``pairs`` as two rows each, ``encode(pair, reply) -> (prompt ids, reply ids)``
    (the loss mask covers the reply ids), leaving out pairs with a row over ``max_length``
    tokens or one ``encode`` rejects (None)."""
    prompts, replies, kept, skipped = [], [], [], 0
    for pair in pairs:
        rows = [encode(pair, pair.chosen), encode(pair, pair.rejected)]
        if any(r is None or len(r[0]) + len(r[1]) > max_length or not r[1] for r in rows):
            skipped += 1
            continue
        for prompt_ids, reply_ids in rows:
            prompts.append(prompt_ids)
            replies.append(reply_ids)
        kept.append(pair)
    if not kept:
        raise ValueError(
            f"every one of the {len(pairs)} preference pairs is longer than "
            f"preference.max_length={max_length} tokens (or empty); raise it"
        )
    return PairBatch(pack(prompts, replies, pad_id), kept, skipped)


def reward_model_rows(tokenizer, chat: bool):
    """``encode`` for reward-model pairs: the text exactly as a reward model's scorer renders
    and tokenizes it when scoring, split after its first token (the score reads the end)."""
    from rlsys.models.reward_model import render_pair, uses_chat

    special = not uses_chat(tokenizer, chat)

    def encode(pair: PreferencePair, reply: str):
        text = render_pair(tokenizer, pair.prompt.text, reply, chat)
        ids = tokenizer(text, add_special_tokens=special)["input_ids"]
        return ids[:1], ids[1:]

    return encode


def policy_rows(collector):
    """``encode`` for DPO pairs: the prompt as the policy sees it (the task's format, chat
    template and instruction) and the reply's tokens followed by EOS, as the policy would
    end it; None for a prompt over ``task.max_prompt_tokens``."""
    tokenizer = collector.tokenizer
    cache: dict[int, list[int] | None] = {}

    def encode(pair: PreferencePair, reply: str):
        uid = pair.prompt.uid
        if uid not in cache:
            _, ids = collector.encode([pair.prompt])
            cache[uid] = ids[0] if ids else None
        if cache[uid] is None:
            return None
        reply_ids = tokenizer.encode(reply, add_special_tokens=False)
        return cache[uid], reply_ids + [tokenizer.eos_token_id]

    return encode


def trim_padding(batch: TrainBatch) -> TrainBatch:
    """``batch`` without the columns no row uses (a sub-batch of a packed dataset keeps the
    whole dataset's width otherwise)."""
    used = np.flatnonzero(batch.attention_mask.any(0))
    start, stop = int(used[0]), int(used[-1]) + 1
    fields = {}
    for name, value in vars(batch).items():
        if isinstance(value, np.ndarray) and value.ndim == 2:
            width = value.shape[1]
            value = (
                value[:, start:stop]
                if width == batch.input_ids.shape[1]
                else value[:, start : stop - 1]
            )
        fields[name] = value
    return TrainBatch(**fields)


def pair_margins(per_row: np.ndarray) -> np.ndarray:
    """Chosen minus rejected of a per-row value (rows 2i / 2i+1)."""
    return per_row[0::2] - per_row[1::2]


def pairwise_accuracy(margins: np.ndarray) -> float:
    """The fraction of pairs ranked right (margin > 0), a tie counting half: a model that
    cannot tell the replies apart (DPO's starting point, margin 0) scores chance, 0.5."""
    return float(np.mean((margins > 0) + 0.5 * (margins == 0)))


def train_on_pairs(
    learner,
    train: PairBatch,
    objective,
    evaluate,
    steps: int,
    batch_size: int,
    eval_every: int,
    prefix: str,
    seed: int,
    tracker,
) -> list[dict]:
    """The loop ``rlsys rm`` and ``rlsys dpo`` share: ``steps`` optimizer steps on
    ``batch_size`` pairs drawn epoch by epoch, ``evaluate(step) -> metrics`` before the first,
    every ``eval_every`` steps and after the last; the learner's figures are logged as
    ``<prefix>/<name>``. Returns the evaluations, each with its step (the first is step 0)."""
    from rlsys.data.sampler import PromptSampler

    sampler = PromptSampler(list(range(len(train.kept))), batch_size, True, seed)
    first = evaluate(0)
    tracker.log(0, first)
    history = [{"step": 0, **first}]
    for step in range(1, steps + 1):
        rows = train.rows(np.array(sampler.next_batch()))
        batch = trim_padding(train.batch.select(rows))
        out = learner.train_step(batch, objective, seed + step, num_mini_batches=1, epochs=1)
        metrics = {f"{prefix}/{k}": v for k, v in out.items()}
        if step % eval_every == 0 or step == steps:
            result = evaluate(step)
            metrics.update(result)
            history.append({"step": step, **result})
        tracker.log(step, metrics)
    return history
