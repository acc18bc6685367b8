"""Rollout engine on a transformers model: batched sampling with behaviour logprobs, decoded in
rlsys's loop, whose batch sheds rows as they end (``shrinking``), or in transformers'
``generate`` (the compiled loop, vision-language models, stop strings)."""

from __future__ import annotations

import inspect
import shutil
import threading
from collections.abc import Iterable

import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria

from rlsys.config.schema import RolloutConfig
from rlsys.engines.base import WAKE_ALL
from rlsys.engines.offload import ParkedWeights
from rlsys.engines.packed_linear import PackedLinears, can_prepack
from rlsys.engines.prefill import lay_out, shared_prefill
from rlsys.engines.settings import HFSettings
from rlsys.engines.shrinking import shrinking_decode
from rlsys.models.attention import use_decode_matmul
from rlsys.models.loading import load_model, load_tokenizer
from rlsys.models.vision import SUPPRESS_KEY, vision_inputs, vision_token_ids
from rlsys.types import Completion, SamplingParams
from rlsys.weight_sync.base import Bucket


class _AbortCriteria(StoppingCriteria):
    """Ends every sequence of a ``generate`` call once ``event`` is set."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        # on the ids' device: generate ORs it with its own criteria there (a CPU tensor
        # failed every HF generation on a GPU)
        return torch.full(
            (input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device
        )


class _Sampler(LogitsProcessor):
    """Picks each next token itself and records its behaviour log-probability; ``generate``
    runs greedy and takes the pick from the scores returned (0 there, -inf elsewhere).

    Sampling inverts the CDF: one uniform per row, searched in the cumulative probabilities.
    On this 2-core CPU that takes 0.55 ms for 32 rows x 49k vocabulary, where transformers'
    ``torch.multinomial`` takes 28 ms (29% of SmolLM2's generation time, per token) and the
    exponential race 28 ms (its ``exponential_`` draws). Scoring here replaces keeping every
    step's full logits (``output_logits``) to log-softmax them afterwards. The
    log-probability is of the full distribution at the sampling temperature (before top-p),
    as the learner computes it."""

    def __init__(
        self,
        temperature: float,
        top_p: float,
        greedy: bool,
        suppress: list[int] | None = None,
        top_k: int = 0,
    ) -> None:
        self.temperature = 1.0 if greedy else temperature
        self.suppress = suppress or []  # tokens never picked (a VL model's placeholders)
        self.top_p = top_p
        self.greedy = greedy
        self.top_k = top_k  # also record the k most likely tokens per step (0: none)
        self.logprobs: list[torch.Tensor] = []  # per step, (B,)
        self.top: list[tuple[torch.Tensor, torch.Tensor]] = []  # per step, (B, k) logp, ids

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        chosen, logp, top = self.pick(scores)
        self.logprobs.append(logp)
        if top is not None:
            self.top.append(top)
        picked = torch.full_like(scores, float("-inf"))
        return picked.scatter_(-1, chosen[:, None], 0.0)

    def pick(
        self, scores: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """Each row's next token from its scores (B, V), its log-probability, and the
        ``top_k`` most likely (log-probabilities, ids) of the distribution drawn from."""
        scores = scores.float()
        if self.suppress:  # a copy: generate's own scores stay as they were
            index = torch.tensor(self.suppress, device=scores.device)
            scores = scores.index_fill(-1, index, float("-inf"))
        if self.temperature != 1.0:  # x / 1 is x: a pass over the vocabulary saved
            scores = scores / self.temperature
        logp = torch.log_softmax(scores, dim=-1)
        if self.greedy:
            chosen = logp.argmax(-1)
        else:
            keep = logp if self.top_p >= 1.0 else _top_p(logp, self.top_p)
            cdf = keep.exp().cumsum(-1)
            u = torch.rand(len(cdf), 1, device=cdf.device) * cdf[:, -1:]
            chosen = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=cdf.shape[1] - 1)
        top = None
        if self.top_k:  # of the distribution drawn from (top-p: its nucleus)
            drawn = logp if self.greedy or self.top_p >= 1.0 else keep
            top = tuple(drawn.topk(min(self.top_k, logp.shape[-1]), dim=-1))
        return chosen, logp.gather(-1, chosen[:, None]).squeeze(-1), top


def _compiled_decode(model, device: torch.device, settings: HFSettings) -> dict:
    """``generate`` arguments of a compiled decode loop (``rollout.engine_args.compile``): a
    static KV cache, so every decode step has the same shapes, and transformers' compiled
    forward step for it; {} when off. Raises naming the setting for a model transformers
    cannot compile."""
    if not settings.compile:
        return {}
    from transformers import CompileConfig

    if not getattr(model, "_can_compile_fullgraph", False):
        raise ValueError(
            f"rollout.engine_args.compile=true: transformers cannot compile "
            f"{type(model).__name__}'s decode step (no static-cache support); set "
            "rollout.engine_args.compile=false"
        )
    if device.type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        raise ValueError(
            "rollout.engine_args.compile=true needs a C++ compiler on a CPU (torch.compile's "
            "inductor builds the decode step with one) and this machine has none on PATH; "
            "install g++ or set rollout.engine_args.compile=false"
        )
    mode = settings.compile_mode or ("reduce-overhead" if device.type == "cuda" else "default")
    config = CompileConfig(fullgraph=False, mode=mode)
    config._compile_all_devices = True  # transformers compiles on GPUs alone unless told
    return {"cache_implementation": "static", "compile_config": config}


def _top_pairs(
    steps: list[tuple[torch.Tensor, torch.Tensor]], length: int
) -> list[list[list[tuple[int, float]]]]:
    """(B, length) rows of (token, logprob) pairs, most likely first, from the sampler's
    per-step ``topk`` results."""
    logps = torch.stack([v for v, _ in steps], dim=1)[:, :length].tolist()
    ids = torch.stack([i for _, i in steps], dim=1)[:, :length].tolist()
    return [
        [
            [(t, lp) for t, lp in zip(i, v, strict=True) if lp != float("-inf")]  # outside top-p
            for i, v in zip(row_ids, row_logps, strict=True)
        ]
        for row_ids, row_logps in zip(ids, logps, strict=True)
    ]


def _top_p(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """``logp`` with -inf outside the smallest set of tokens whose mass reaches ``top_p``
    (the most likely token always kept)."""
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    probs = sorted_logp.exp()
    sorted_drop = probs.cumsum(-1) - probs >= top_p  # the mass ahead of it already suffices
    drop = torch.empty_like(sorted_drop).scatter_(-1, order, sorted_drop)
    return logp.masked_fill(drop, float("-inf"))


class HFEngine:
    """Generates with a plain Hugging Face model held in this process."""

    def __init__(
        self,
        model_path: str,
        dtype: str,
        cfg: RolloutConfig,
        device: str = "cpu",
        settings: HFSettings | None = None,
    ):
        self.device = torch.device(device)
        self.model = load_model(model_path, dtype).to(self.device)
        # a plugin subclass's own settings are ours only when they extend HFSettings
        # (docs/extending.md, How to add a rollout engine); otherwise the defaults
        own = settings if isinstance(settings, HFSettings) else HFSettings()
        if own.matmul_decode(self.device.type):
            use_decode_matmul(self.model)
        self._compiled = _compiled_decode(self.model, self.device, own)
        self.model_path = model_path
        self.micro = cfg.micro_batch_size
        self._aborting = threading.Event()
        self._tokenizer = None  # loaded on first use of stop strings
        config = self.model.config.get_text_config()  # a VL model's: its decoder's
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        eos = config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.suppress = vision_token_ids(self.model.config)  # [] for a text model
        # not for the compiled loop (its static cache cannot start from a prefilled dynamic
        # one) nor a vision-language model (its rotary positions come from its own inputs)
        self._share_prefill = (
            own.share_prefill
            and not self._compiled
            and not self.suppress
            and self.model._supports_default_dynamic_cache()
        )
        # the same exclusions, and a model that decodes from transformers' dynamic cache
        self._shrink = (
            own.shrink_batch
            and not self._compiled
            and not self.suppress
            and self.model._supports_default_dynamic_cache()
        )
        self._cache_in_place = own.cache_in_place
        forward_args = inspect.signature(self.model.forward).parameters
        self._one_logit = {"logits_to_keep": 1} if "logits_to_keep" in forward_args else {}
        self.version = 0
        self._parked = ParkedWeights(self.model, self.device)
        # CPU weights packed for oneDNN once per version (the compiled loop packs its own)
        self._prepacked = None
        if own.prepack and not self._compiled and can_prepack(self.model):
            self._prepacked = PackedLinears(self.model, self.micro, fuse=own.fuse_linears)

    def _check_awake(self, call: str) -> None:
        if self._parked.parked:
            raise RuntimeError(f"HFEngine.{call} while the engine sleeps: call wake() first")

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        budgets: list[int] | None = None,
        images: list | None = None,
    ) -> list[list[Completion]]:
        """``sampling.n`` completions for each prompt (token ids -> token ids + logprobs); prompt
        i gets at most ``budgets[i]`` new tokens (default ``sampling.max_new_tokens``) and,
        for a vision-language model, shows ``images[i]`` (its ``PromptPixels``, or None)."""
        self._check_awake("generate")
        if self._prepacked is not None:
            self._prepacked.pack()  # after a weight load: once, for every call until the next
        self._aborting.clear()
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        budgets = budgets or [sampling.max_new_tokens] * len(prompts)
        images = images or [None] * len(prompts)
        flat = [
            (p, b, im)
            for p, b, im in zip(prompts, budgets, images, strict=True)
            for _ in range(sampling.n)
        ]
        results: list[Completion] = []
        try:
            for start in range(0, len(flat), self.micro):
                if self._aborting.is_set():  # later micro-batches never start
                    results.extend(Completion([], [], "abort", self.version) for _ in flat[start:])
                    break
                results.extend(self._generate_batch(flat[start : start + self.micro], sampling))
        finally:
            if self._prepacked is not None:
                self._prepacked.forget()  # sibling outputs no call claimed
        return [results[i * sampling.n : (i + 1) * sampling.n] for i in range(len(prompts))]

    def _generate_batch(self, rows: list[tuple], sampling: SamplingParams):
        prompts = [p for p, _, _ in rows]
        budgets = [b for _, b, _ in rows]
        if self._share_prefill:
            ids, mask, cache = shared_prefill(
                self.model, prompts, self.pad_id, self.device, self._one_logit
            )
        else:
            (ids, mask), cache = lay_out(prompts, self.pad_id), None
        prefilled = {"past_key_values": cache} if cache is not None else {}
        sampler = _Sampler(
            sampling.temperature,
            sampling.top_p,
            sampling.greedy,
            self.suppress,
            sampling.top_logprobs,
        )
        stop_ids = self.eos_ids | set(sampling.stop_token_ids)
        if self._shrink and not sampling.stop:
            decoded = shrinking_decode(
                self.model,
                ids.to(self.device),
                mask.to(self.device),
                budgets,
                sampler.pick,
                stop_ids,
                self._aborting,
                cache,
                self._one_logit,
                in_place=self._cache_in_place,
            )
            new_tokens, logprobs, top = decoded.tokens, decoded.logprobs, decoded.top
        else:
            new_tokens, logprobs, top = self._generate(
                ids, mask, rows, sampling, sampler, prefilled, stop_ids
            )
        aborted = self._aborting.is_set()
        texts = self._stop_string_ends(new_tokens, sampling.stop)
        completions = []
        for i, (row, row_logprobs) in enumerate(zip(new_tokens, logprobs, strict=True)):
            budget = budgets[i]
            row = row[:budget]  # a shorter budget than the micro-batch's longest
            end = next((j + 1 for j, t in enumerate(row) if t in stop_ids), None)
            if texts[i] is not None and texts[i] <= budget and (end is None or texts[i] < end):
                end = texts[i]
            if end is not None:
                reason = "stop"
            elif aborted and len(row) < budget:
                reason = "abort"
            else:
                reason = "length"
            length = end if end is not None else len(row)
            completion = Completion(row[:length], row_logprobs[:length], reason, self.version)
            if top is not None:
                completion.top_logprobs = top[i][:length]
            completions.append(completion)
        return completions

    def _generate(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        rows: list[tuple],
        sampling: SamplingParams,
        sampler: _Sampler,
        prefilled: dict,
        stop_ids: set[int],
    ) -> tuple[list[list[int]], list[list[float]], list | None]:
        """transformers' ``generate`` on one micro-batch (every row decoded until the last
        ends): per row the new tokens, their log-probabilities and top alternatives."""
        vision = vision_inputs(self.model.config, ids, [im for _, _, im in rows], self.device)
        vision.pop(SUPPRESS_KEY, None)  # the sampler suppresses them (self.suppress)
        stop_kwargs = {}
        if sampling.stop:
            if self._tokenizer is None:
                self._tokenizer = load_tokenizer(self.model_path)
            stop_kwargs = {"stop_strings": list(sampling.stop), "tokenizer": self._tokenizer}
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            max_new_tokens=max(b for _, b, _ in rows),
            do_sample=False,  # the sampler picks: see _Sampler
            pad_token_id=self.pad_id,
            eos_token_id=sorted(stop_ids),
            return_dict_in_generate=True,
            logits_processor=LogitsProcessorList([sampler]),
            stopping_criteria=[_AbortCriteria(self._aborting)],
            **self._compiled,
            **stop_kwargs,
            **vision,
            **prefilled,
        )
        new_tokens = out.sequences[:, ids.shape[1] :].cpu()
        logprobs = torch.stack(sampler.logprobs, dim=1).cpu()[:, : new_tokens.shape[1]]
        top = _top_pairs(sampler.top, new_tokens.shape[1]) if sampler.top else None
        return new_tokens.tolist(), logprobs.tolist(), top

    def _stop_string_ends(self, new_tokens: list[list[int]], stop: list[str]) -> list[int | None]:
        """Per row, the token count up to and including the first stop-string match."""
        if not stop:
            return [None] * len(new_tokens)
        ends: list[int | None] = []
        for row in new_tokens:
            text, end = "", None
            for j, token in enumerate(row):
                text += self._tokenizer.decode([token])
                if any(s in text for s in stop):
                    end = j + 1
                    break
            ends.append(end)
        return ends

    @torch.no_grad()
    def update_weights(self, buckets: Iterable[Bucket], version: int, adopt: bool = False) -> int:
        """Copy full tensors into the model, bucket by bucket; returns tensors loaded.
        ``adopt``: parameters become the received tensors themselves (views of the weight
        transport's shared memory, valid until the next update); buffers are still copied."""
        self._check_awake("update_weights")
        if self._prepacked is not None:
            self._prepacked.drop()
        loaded = 0
        state = self.model.state_dict()  # looked up now: sleep/wake move the storage
        params = dict(self.model.named_parameters(remove_duplicate=False)) if adopt else {}
        for bucket in buckets:
            for name, tensor in bucket.items():
                if name not in state:
                    raise KeyError(f"weight {name!r} from the learner has no match in the engine")
                param = params.get(name)
                if param is None:
                    state[name].copy_(tensor)
                elif tensor.dtype != param.dtype or tensor.shape != param.shape:
                    raise ValueError(
                        f"weight {name!r} arrived as {tensor.dtype} {tuple(tensor.shape)} but the "
                        f"engine holds {param.dtype} {tuple(param.shape)}: it cannot keep it as a "
                        "view; set weight_sync.zero_copy=false"
                    )
                else:
                    param.data = tensor
                loaded += 1
        self.version = version
        return loaded

    def view_dtype(self) -> str | None:
        """On a CPU, with every parameter of one dtype: that dtype (the engine can point its
        weights at a resident transport's shared memory). GPUs: None."""
        dtypes = {p.dtype for p in self.model.parameters()}
        if self.device.type != "cpu" or len(dtypes) != 1:
            return None
        return str(dtypes.pop()).removeprefix("torch.")

    def sleep(self) -> int:
        """Free the weights' memory while learners train (colocated): to host memory on a
        GPU, to a scratch file on a CPU (``ParkedWeights``); returns the bytes freed. The KV
        cache lives only within a ``generate`` call, so there is none to drop; prepacked
        weights are dropped (packed again at the next ``generate``)."""
        if self._prepacked is not None:
            self._prepacked.drop()
        return self._parked.park()

    def wake(self, tags: tuple[str, ...] = WAKE_ALL) -> None:
        """Undo ``sleep``: the weights of the version loaded last come back ("weights" in
        ``tags``; the KV cache is made per call, so "kv_cache" has nothing to bring)."""
        if "weights" in tags:
            self._parked.restore()

    def abort(self) -> None:
        """Stop the running ``generate`` (safe from another thread); it returns what each
        sequence produced so far, unfinished ones with ``finish_reason="abort"``."""
        self._aborting.set()
