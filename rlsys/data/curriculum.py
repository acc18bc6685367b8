"""Online difficulty curriculum: draw the prompts whose groups are most likely to teach.

A GRPO-style group of ``n`` samples teaches nothing when every sample is right or every one
is wrong (all advantages are 0); at pass rate ``p`` that happens with probability
``p**n + (1-p)**n``. The uniform sampler draws such prompts anyway, and the uniform-group
filter (DAPO's dynamic sampling) throws their groups away after paying for their generation.

``CurriculumSampler`` keeps a Beta posterior of the pass rate per bucket of prompts (a prompt
metadata value such as a difficulty level, or each prompt on its own), updated from every
scored group, and draws prompts in proportion to their bucket's probability of an informative
group, ``1 - p**n - (1-p)**n``, with ``p`` drawn from the posterior (Thompson sampling, so a
bucket with little evidence still gets tried). With ``score=mixed_rate`` the posterior is of
that probability itself, counted from the groups (mixed or not), which sees a bucket whose
prompts are each all right or all wrong for what it is.

Among the papers issue 26 names this is closest to VADE (a Beta posterior of each prompt's
pass rate, Thompson-sampled, favouring prompts whose groups have reward variance). Departures:
the score is the probability that a group of the run's own ``n`` is mixed, rather than the
Bernoulli variance ``p(1-p)`` (they rank prompts alike; this one is the filter's own waste);
buckets pool evidence the way DUMP's distribution-level bandit does, for datasets seen less
than once per run, and with buckets each prompt seen before draws from its own posterior with
its bucket's estimate as the prior (prompts of one bucket often sit at 0 or n right while the
bucket's average does not); evidence fades geometrically (``memory_groups``) instead
of being reset, and a ``uniform_mix`` share of every draw stays uniform.

Updates are applied at step boundaries (``observe`` from the controller), so in synchronous
mode a draw depends only on earlier steps' groups and a resumed run draws what the
uninterrupted one did.
"""

from __future__ import annotations

import threading

import numpy as np

from rlsys.config.data import CurriculumConfig
from rlsys.types import Prompt, RolloutGroup

PRIOR = 1.0  # Beta(1, 1): a bucket never seen is equally likely to be at any pass rate


class CurriculumSampler:
    """Draws batches of prompts weighted by their bucket's chance of an informative group
    (the module docstring); ``observe`` feeds it scored groups. Thread-safe: the feeder draws
    while the controller observes."""

    def __init__(
        self,
        prompts: list[Prompt],
        batch_size: int,
        n_samples: int,
        cfg: CurriculumConfig,
        seed: int,
    ) -> None:
        if not prompts:
            raise ValueError("the task's train split is empty; check task.* settings")
        self.prompts, self.batch_size, self.n, self.cfg, self.seed = (
            prompts,
            batch_size,
            n_samples,
            cfg,
            seed,
        )
        self.bucket_names, self.bucket_of = _buckets(prompts, cfg.bucket_key)
        self.bucket_size = np.bincount(self.bucket_of, minlength=len(self.bucket_names))
        self._index_of_uid = {p.uid: i for i, p in enumerate(prompts)}
        self.right = np.zeros(len(self.bucket_names))  # faded counts of correct samples
        self.wrong = np.zeros(len(self.bucket_names))
        self.mixed = np.zeros(len(self.bucket_names))  # faded counts of mixed groups
        self.uniform = np.zeros(len(self.bucket_names))  # ... and of all-equal ones
        # With buckets, each prompt's own evidence too (its bucket's estimate is the prior):
        # rows right, wrong, mixed, uniform
        per_prompt = cfg.bucket_key is not None and cfg.prompt_prior_samples is not None
        self.prompt_counts = np.zeros((4, len(prompts))) if per_prompt else None
        self.draws = 0  # batches drawn: the random stream of the next one
        self._keep = 1.0 - 1.0 / cfg.memory_groups  # weight of older evidence per new group
        self._lock = threading.Lock()

    def next_batch(self, size: int | None = None) -> list[Prompt]:
        """``size`` (default ``batch_size``) distinct prompts, drawn by informativeness."""
        size = min(size or self.batch_size, len(self.prompts))
        with self._lock:
            rng = np.random.default_rng([self.seed, self.draws])
            self.draws += 1
            if self.cfg.score == "mixed_rate":
                weight = self._drawn_rate(rng, self.mixed, self.uniform, 2)
            else:
                p = self._drawn_rate(rng, self.right, self.wrong, 0)
                weight = 1.0 - p**self.n - (1.0 - p) ** self.n
        weight = weight**self.cfg.sharpness
        probs = (1.0 - self.cfg.uniform_mix) * weight / weight.sum()
        probs += self.cfg.uniform_mix / len(self.prompts)
        picked = rng.choice(len(self.prompts), size=size, replace=False, p=probs / probs.sum())
        return [self.prompts[i] for i in picked]

    def _drawn_rate(
        self, rng: np.random.Generator, hits: np.ndarray, misses: np.ndarray, row: int
    ) -> np.ndarray:
        """A Thompson draw of a rate per prompt: from its bucket's Beta posterior of
        (``hits``, ``misses``), and for every prompt seen before from its own posterior
        (rows ``row``, ``row + 1`` of ``prompt_counts``), whose prior is the bucket's draw worth
        ``prompt_prior_samples`` observations (a prompt's groups often sit at 0 or n right while
        its bucket's average does not)."""
        rate = rng.beta(PRIOR + hits, PRIOR + misses)[self.bucket_of]
        if self.prompt_counts is None:
            return rate
        own_hits, own_misses = self.prompt_counts[row], self.prompt_counts[row + 1]
        seen = np.flatnonzero(own_hits + own_misses > 0)
        if seen.size:
            strength, prior = self.cfg.prompt_prior_samples, rate[seen]
            rate[seen] = rng.beta(
                strength * prior + own_hits[seen] + 1e-3,
                strength * (1.0 - prior) + own_misses[seen] + 1e-3,
            )
        return rate

    def observe(self, groups: list[RolloutGroup]) -> None:
        """Fold scored groups into their buckets' estimates (a sample counts as right when
        the verifier says so: ``Sample.correct``). Groups of prompts outside the train split
        (none in a run) are ignored."""
        rows = sorted(  # order-free: the same groups give the same estimates
            (i, sum(s.correct for s in g.samples), len(g.samples))
            for g in groups
            if (i := self._index_of_uid.get(g.prompt.uid)) is not None
        )
        with self._lock:
            for prompt, right, total in rows:
                bucket = self.bucket_of[prompt]
                mixed = float(0 < right < total)
                seen = np.array([right, total - right, mixed, 1.0 - mixed])
                for counts, value in zip(
                    (self.right, self.wrong, self.mixed, self.uniform), seen, strict=True
                ):
                    counts[bucket] = self._keep * counts[bucket] + value
                if self.prompt_counts is not None:
                    own = self.prompt_counts[:, prompt]
                    self.prompt_counts[:, prompt] = self._keep * own + seen

    def metrics(self) -> dict[str, float]:
        """The spread of estimated pass rates over the prompts whose bucket has evidence."""
        with self._lock:
            seen = (self.right + self.wrong) > 0
            mean = (PRIOR + self.right) / (2 * PRIOR + self.right + self.wrong)
        if not seen.any():
            return {"data/buckets_seen_frac": 0.0}
        rates = np.repeat(mean[seen], self.bucket_size[seen])  # per prompt
        return {
            "data/buckets_seen_frac": float(seen.mean()),
            "data/pass_rate_p10": float(np.quantile(rates, 0.1)),
            "data/pass_rate_p50": float(np.quantile(rates, 0.5)),
            "data/pass_rate_p90": float(np.quantile(rates, 0.9)),
        }

    def state_dict(self) -> dict:
        with self._lock:
            state = {
                "draws": self.draws,
                "buckets": list(self.bucket_names),
                "right": self.right.tolist(),
                "wrong": self.wrong.tolist(),
                "mixed": self.mixed.tolist(),
                "uniform": self.uniform.tolist(),
            }
            if self.prompt_counts is not None:  # only the prompts seen: most are not, early on
                seen = np.flatnonzero(self.prompt_counts[0] + self.prompt_counts[1] > 0)
                state["prompts"] = {
                    str(i): self.prompt_counts[:, i].tolist() for i in seen.tolist()
                }
            return state

    def load_state_dict(self, state: dict) -> None:
        if "buckets" not in state:
            raise ValueError(
                "the checkpoint's prompt sampler is the uniform one but data.sampler="
                "curriculum; resume with data.sampler=uniform or start a new run"
            )
        if state["buckets"] != list(self.bucket_names):
            raise ValueError(
                "the checkpoint's curriculum buckets differ from this run's (another task or "
                "data.curriculum.bucket_key); resume with the run's own task settings"
            )
        with self._lock:
            self.draws = state["draws"]
            self.right = np.asarray(state["right"], dtype=float)
            self.wrong = np.asarray(state["wrong"], dtype=float)
            zeros = [0.0] * len(self.bucket_names)  # checkpoints before the mixed-rate score
            self.mixed = np.asarray(state.get("mixed", zeros), dtype=float)
            self.uniform = np.asarray(state.get("uniform", zeros), dtype=float)
            if self.prompt_counts is not None:
                self.prompt_counts[:] = 0.0
                for index, counts in state.get("prompts", {}).items():
                    self.prompt_counts[: len(counts), int(index)] = counts


def _buckets(prompts: list[Prompt], key: str | None) -> tuple[list[str], np.ndarray]:
    """The bucket names (sorted) and each prompt's bucket index."""
    if key is None:
        return [str(p.uid) for p in prompts], np.arange(len(prompts))
    missing = [p.uid for p in prompts if key not in p.meta]
    if missing:
        raise ValueError(
            f"data.curriculum.bucket_key={key!r}: {len(missing)} train prompts lack that "
            f"metadata key (first uid {missing[0]}); name a key every prompt has, or set "
            "data.curriculum.bucket_key=null to estimate each prompt on its own"
        )
    names = sorted({str(p.meta[key]) for p in prompts})
    index = {name: i for i, name in enumerate(names)}
    return names, np.array([index[str(p.meta[key])] for p in prompts])
