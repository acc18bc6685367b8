"""The synthetic preference task of the RLHF example (``task=reviews``): continue a review.

A prompt opens a short review, ``the soup at the cafe was ``; a reply finishes it with two
adjectives, ``dull and tasty``. A hidden labeller, standing in for the people who compare
replies, prefers positive reviews: its score (``sentiment_score``, the ``sentiment`` reward)
is the number of positive adjectives minus negative ones over two, and a reply not of the
form ``<adjective> and <adjective>`` from its lexicon scores -1. The task metric is the
labeller's verdict: the fraction of held-out prompts whose greedy reply it scores above 0.

The demonstrations (each prompt's ``answer``, what ``rlsys sft`` imitates) are of mixed
sentiment, with a lean that depends on the reviewed thing, like reviews people wrote rather
than what the labeller prefers; so the SFT policy is positive for some things and negative
for others, and preference learning has a gap to close. This mirrors the positive-sentiment
continuation task of Ziegler et al. (2019), "Fine-Tuning Language Models from Human
Preferences", with a lexicon in place of human raters, so the gain can be measured exactly.

Judging is far easier than it is for arithmetic: a reward model only has to know which
words are positive, and a small one learns that from the pairs, where it could not learn to
check a sum any better than the policy computes it (PPO then exploits its mistakes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlsys.types import Prompt

if TYPE_CHECKING:
    from rlsys.config.schema import TaskConfig

POSITIVE = ("good", "great", "fun", "nice", "tasty", "lovely")
NEGATIVE = ("bad", "dull", "poor", "awful", "bland", "rude")
NEUTRAL = ("big", "old", "new", "loud", "busy", "small")
_VALUE = {
    **{word: 1 for word in POSITIVE},
    **{word: -1 for word in NEGATIVE},
    **{word: 0 for word in NEUTRAL},
}
NOUNS = (
    "soup", "tea", "cake", "pizza", "bread", "coffee", "salad", "pasta", "pie", "curry",
    "film", "show", "play", "song", "book", "game", "band", "tour", "class", "talk",
    "room", "bed", "view", "pool", "bus", "train", "car", "bike", "phone", "lamp",
)  # fmt: skip
PLACES = (
    "the cafe", "the hotel", "the fair", "the club", "the park", "the mall", "the inn",
    "the beach", "the market", "the school", "the studio", "the station", "the zoo",
    "the farm", "the lake", "the gym", "the shop", "the deli", "the pub", "the camp",
)  # fmt: skip
# Each opening ends in a space, so the reply's first word follows it directly.
OPENINGS = ("the {noun} at {place} was ", "our {noun} at {place} felt ", "my {noun} at {place} is ")
REPLY_TOKENS = 18  # the longest reply, "lovely and lovely", and EOS (a character a token)


def sentiment_score(reply: str) -> float:
    """The labeller's score of ``reply`` in [-1, 1]: (positive - negative adjectives) / 2
    for ``<adjective> and <adjective>`` from the lexicon, -1 for anything else."""
    words = reply.split()
    if len(words) != 3 or words[1] != "and" or any(w not in _VALUE for w in words[::2]):
        return -1.0
    return (_VALUE[words[0]] + _VALUE[words[2]]) / 2


def _lean(noun_index: int) -> float:
    """How often the demonstrations about a noun are positive, spread over [0.15, 0.85]
    (the same for every seed, so runs compare)."""
    return 0.15 + 0.7 * ((noun_index * 7) % len(NOUNS)) / (len(NOUNS) - 1)


def demonstration(noun_index: int, rng: np.random.Generator) -> str:
    """A written review's two adjectives: each neutral 30% of the time, else positive with
    the noun's lean, else negative."""
    words = []
    for _ in range(2):
        if rng.random() < 0.3:
            pool = NEUTRAL
        elif rng.random() < _lean(noun_index):
            pool = POSITIVE
        else:
            pool = NEGATIVE
        words.append(pool[int(rng.integers(len(pool)))])
    return f"{words[0]} and {words[1]}"


def review_prompts(cfg: TaskConfig, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """Distinct review openings, each with a demonstration reply as its ``answer``; the
    first ``task.eval_size`` are held out."""
    combos = [(o, n, p) for o in range(len(OPENINGS)) for n in range(len(NOUNS)) for p in PLACES]
    wanted = cfg.train_size + cfg.eval_size
    if wanted > len(combos):
        raise ValueError(
            f"task.train_size + task.eval_size = {wanted} exceeds the {len(combos)} distinct "
            "review openings of task=reviews; lower them (conf/task/reviews.yaml uses 1300 + 500)"
        )
    rng = np.random.default_rng([seed, 11])
    prompts = []
    for uid, pick in enumerate(rng.permutation(len(combos))[:wanted].tolist()):
        opening, noun, place = combos[pick]
        text = OPENINGS[opening].format(noun=NOUNS[noun], place=place)
        prompts.append(Prompt(uid, text, demonstration(noun, rng), {"noun": NOUNS[noun]}))
    return prompts[cfg.eval_size :], prompts[: cfg.eval_size]
