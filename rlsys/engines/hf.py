"""Rollout engine on transformers' ``generate``: batched sampling with behaviour logprobs."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rlsys.models.loading import load_model
from rlsys.types import Completion, SamplingParams
from rlsys.weight_sync.base import Bucket


class HFEngine:
    """Generates with a plain Hugging Face model held in this process."""

    def __init__(self, model_path: str, dtype: str, micro_batch_size: int, device: str = "cpu"):
        self.device = torch.device(device)
        self.model = load_model(model_path, dtype).to(self.device)
        self.micro = micro_batch_size
        config = self.model.config
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        eos = config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.version = 0

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams
    ) -> list[list[Completion]]:
        """``sampling.n`` completions for each prompt (token ids -> token ids + logprobs)."""
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        flat = [p for p in prompts for _ in range(sampling.n)]
        results: list[Completion] = []
        for start in range(0, len(flat), self.micro):
            results.extend(self._generate_batch(flat[start : start + self.micro], sampling))
        return [results[i * sampling.n : (i + 1) * sampling.n] for i in range(len(prompts))]

    def _generate_batch(self, prompts: list[list[int]], sampling: SamplingParams):
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        sample_kwargs = (
            {"do_sample": False}
            if sampling.greedy
            else {
                "do_sample": True,
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "top_k": 0,
            }
        )
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            max_new_tokens=sampling.max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=sorted(self.eos_ids),
            output_logits=True,
            return_dict_in_generate=True,
            **sample_kwargs,
        )
        new_tokens = out.sequences[:, width:].cpu()
        temperature = 1.0 if sampling.greedy else sampling.temperature
        logits = torch.stack(out.logits, dim=1).float().cpu() / temperature  # (B, R, V)
        logprobs = torch.log_softmax(logits, -1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        completions = []
        for row, row_logprobs in zip(new_tokens.tolist(), logprobs.tolist(), strict=True):
            end = next((j + 1 for j, t in enumerate(row) if t in self.eos_ids), None)
            length = end if end is not None else len(row)
            completions.append(
                Completion(
                    token_ids=row[:length],
                    logprobs=row_logprobs[:length],
                    finish_reason="stop" if end is not None else "length",
                    version=self.version,
                )
            )
        return completions

    @torch.no_grad()
    def update_weights(self, buckets: Iterable[Bucket], version: int) -> int:
        """Copy full tensors into the model, bucket by bucket; returns tensors loaded."""
        loaded = 0
        params = self.model.state_dict()  # looked up now: sleep/wake move the storage
        for bucket in buckets:
            for name, tensor in bucket.items():
                if name not in params:
                    raise KeyError(f"weight {name!r} from the learner has no match in the engine")
                params[name].copy_(tensor)
                loaded += 1
        self.version = version
        return loaded

    def sleep(self) -> None:
        """Free accelerator memory while learners train (colocated); a no-op on CPU."""
        if self.device.type == "cuda":
            self.model.to("cpu")
            torch.cuda.empty_cache()

    def wake(self) -> None:
        """Undo ``sleep``."""
        if self.device.type == "cuda":
            self.model.to(self.device)

    def abort(self) -> None:
        """Generation here is one blocking call; nothing is in flight to abort."""
