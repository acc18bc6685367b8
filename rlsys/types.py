"""The records that flow through rlsys. Tensor shapes are in comments.

B = sequences in a batch, T = padded sequence length (prompt + response); per-token arrays of
length T-1 are aligned with the *targets* ``input_ids[:, 1:]``: entry t scores token t+1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class PromptPixels:
    """A prompt's images as the vision tower reads them (``rlsys.models.vision``): the
    processor's patches of every image, concatenated in the order their tokens appear."""

    pixel_values: np.ndarray  # (N, D) float32, N patches of every image, D = C * t * p * p
    image_grid_thw: np.ndarray  # (I, 3) int64, (t, h, w) patches per image; sum of products = N


@dataclass
class Prompt:
    """One task instance."""

    uid: int
    text: str
    answer: str  # ground truth the verifier compares against
    meta: dict = field(default_factory=dict)
    # images shown before the text (vision-language models): each a file path, encoded
    # bytes (PNG, JPEG) or an object with ``render() -> PIL.Image`` (drawn on the fly from a
    # seed: rlsys.data.shapes); see rlsys.data.images
    images: list = field(default_factory=list)
    # the images processed, set when the prompt is encoded for a vision-language model
    pixels: PromptPixels | None = None
    # the prompt as chat messages ({"role", "content"}), where the dataset gave it so (verl's
    # layout): rendered with the tokenizer's chat template; ``text`` is the last user turn
    messages: list[dict] | None = None


@dataclass
class SamplingParams:
    """How an engine samples: ``n`` completions per prompt."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16
    greedy: bool = False
    seed: int | None = None  # per-request seeds derive from it (same seed, same samples)
    stop: list[str] = field(default_factory=list)  # stop strings (the match stays in the output)
    stop_token_ids: list[int] = field(default_factory=list)  # stop tokens besides EOS
    # also return the k most likely tokens at each position (Completion.top_logprobs; tree
    # rollouts' iid mode); 0: the sampled token's logprob only
    top_logprobs: int = 0


@dataclass
class Episode:
    """What a multi-turn environment reported over one trajectory (``rlsys.envs``)."""

    reward: float = 0.0  # turn-level rewards summed with the trajectory-level one
    correct: bool = False  # the environment's verdict (e.g. the final answer was right)
    turns: int = 0  # model turns taken
    tool_calls: int = 0  # well-formed tool calls answered
    tool_errors: int = 0  # malformed calls or tools that failed
    truncated: bool = False  # ended by rollout.env.max_turns or max_total_tokens
    tool_s: float = 0.0  # seconds its environment steps ran, summed over its turns
    tool_overlap_s: float = 0.0  # of those, seconds a generation call ran at the same time
    tool_timeouts: int = 0  # steps past task.env.step_timeout_s (also in tool_errors)
    # openai_agent (rlsys/agents): recorded calls left out of the trajectory (the agent
    # rewrote history), and whether the agent raised or ran past task.env.agent_timeout_s
    dropped_calls: int = 0
    agent_error: bool = False


@dataclass
class Turn:
    """One model turn of a multi-turn trajectory (a step, for step-level advantages: GiGPO)."""

    start: int  # index in the tokens of the turn's first token (Completion.token_ids)
    end: int  # one past its last token; the observation answering it (masked) follows
    reward: float  # the environment's reward for this turn (StepResult.reward)
    # the anchor-state key of the state the turn acted on: turns of a group with equal keys
    # acted on the same state (default: a digest of the observations so far; see rlsys.envs)
    state: str


@dataclass
class Completion:
    """One generated response, as the engine produced it (multi-turn: the whole trajectory,
    the model's turns with the environment's observations between them)."""

    token_ids: list[int]  # (R,) generated tokens, including a final EOS if one was produced
    logprobs: list[float]  # (R,) behaviour log pi(token | prefix) at the sampling temperature
    finish_reason: str  # "stop" (EOS, stop token or string) | "length" | "abort"
    version: int  # policy version of the weights that produced the first token (the oldest)
    # (R,) version per token when a partial rollout was continued under newer weights;
    # None when every token came from ``version``
    token_versions: list[int] | None = None
    # (R,) 1 on tokens the model generated, 0 on environment tokens (observations, tool
    # results), which are left out of the loss; None when every token is the model's
    mask: list[int] | None = None
    episode: Episode | None = None  # multi-turn only
    # tree rollouts: (tree node id, tokens) of each segment of this reply, the root's child
    # first; node ids are unique within the group, so leaves that share a node share those
    # tokens (and their logprobs, copied); None: sampled on its own (flat)
    segments: list[tuple[int, int]] | None = None
    # (P,) the prompt this completion continues when it is not the request's (an agent's own
    # first message, rlsys/agents); None: the request's prompt
    prompt_ids: list[int] | None = None
    turns: list[Turn] | None = None  # multi-turn only: the model's turns, in order
    # (R,) the SamplingParams.top_logprobs most likely tokens at each position, as (token,
    # behaviour logprob) pairs, most likely first; None when not asked for
    top_logprobs: list[list[tuple[int, float]]] | None = None

    def versions(self) -> list[int]:
        """(R,) the policy version of every token."""
        if self.token_versions is not None:
            return self.token_versions
        return [self.version] * len(self.token_ids)

    def trained(self) -> list[int]:
        """(R,) 1 on every token the loss covers (the model's own)."""
        return self.mask if self.mask is not None else [1] * len(self.token_ids)

    def continued(self, more: Completion) -> Completion:
        """This (aborted) completion followed by ``more``, generated from its end: tokens,
        logprobs, per-token versions and masks concatenated, ``more``'s finish reason."""
        mask = None
        if self.mask is not None or more.mask is not None:
            mask = self.trained() + more.trained()
        return Completion(
            self.token_ids + more.token_ids,
            self.logprobs + more.logprobs,
            more.finish_reason,
            min(self.version, more.version) if self.token_ids else more.version,
            self.versions() + more.versions(),
            mask,
        )


@dataclass
class Sample:
    """A scored completion."""

    prompt: Prompt
    prompt_ids: list[int]
    completion: Completion
    text: str  # decoded completion (special tokens stripped)
    reward: float = 0.0
    correct: bool = False  # what the verifier says, independent of reward shaping
    ref_logprobs: np.ndarray | None = None  # (R,) reference policy, when a KL term needs it
    reward_components: dict[str, float] = field(default_factory=dict)  # name -> unweighted
    # a success of an earlier group put into this one by the replay store (rlsys.buffer.replay)
    replayed: bool = False


@dataclass
class RolloutGroup:
    """All samples of one prompt (the GRPO group)."""

    prompt: Prompt
    samples: list[Sample]
    baseline: Sample | None = None  # ReMax: the greedy reply, scored like the samples

    @property
    def version(self) -> int:
        """The oldest policy version among the samples generated for this group (replayed
        ones, older by design, are bounded by ``buffer.replay.max_age`` instead)."""
        return min(s.completion.version for s in self.samples if not s.replayed)


@dataclass
class TrainBatch:
    """What the learner trains on. numpy arrays travel zero-copy through Ray."""

    input_ids: np.ndarray  # (B, T) int64, prompt left-padded, response right-padded
    attention_mask: np.ndarray  # (B, T) int64, 1 on real tokens
    loss_mask: np.ndarray  # (B, T-1) float32, 1 where the target is a trained response token
    behaviour_logprobs: np.ndarray  # (B, T-1) float32, log pi_behaviour from the engine
    advantages: np.ndarray | None = None  # (B, T-1) float32
    old_logprobs: np.ndarray | None = None  # (B, T-1) float32, learner before this update
    ref_logprobs: np.ndarray | None = None  # (B, T-1) float32, frozen reference policy
    values: np.ndarray | None = None  # (B, T-1) float32, critic values before this update
    returns: np.ndarray | None = None  # (B, T-1) float32, the critic's regression targets
    rewards: np.ndarray | None = None  # (B,) float32
    versions: np.ndarray | None = None  # (B,) int64, policy version per sample (oldest token)
    is_weights: np.ndarray | None = None  # (B, T-1) float32, off-policy importance weights
    # vision-language models: (B,) object arrays, one entry per row (rows of a group share
    # one array): row i's PromptPixels.pixel_values (N_i, D) float32 and image_grid_thw
    # (I_i, 3) int64, None on a row without images. Per row so that ``select`` and
    # micro-batching keep a sequence's images with it; the backend concatenates them.
    pixel_values: np.ndarray | None = None
    image_grid_thw: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, rows: np.ndarray) -> TrainBatch:
        """The sub-batch of ``rows`` (every array field sliced the same way)."""
        fields = {k: (v[rows] if isinstance(v, np.ndarray) else v) for k, v in vars(self).items()}
        return TrainBatch(**fields)


def pixels_of(prompts: list[Prompt]) -> list | None:
    """(prompts,) each prompt's ``PromptPixels`` (None without images); None when no prompt
    has images (a text-only call)."""
    if all(p.pixels is None for p in prompts):
        return None
    return [p.pixels for p in prompts]
