"""The full weights of a backend, gathered from its shards: in buckets for a weight sync to
the engines (the policy), or written as a Hugging Face directory (the policy, a reward
model). Collective: every rank gathers; rank 0 holds the result."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from rlsys.backends.engine import BackendEngine
from rlsys.backends.lora_merge import merged_state
from rlsys.models import lora
from rlsys.models.loading import save_tokenizer
from rlsys.models.saving import save_pretrained
from rlsys.models.vision import VISION_PREFIX


class FullWeights(BackendEngine):
    """Full (unsharded) tensors out of the backend: weight buckets and ``save_hf``."""

    @torch.no_grad()
    def iter_weight_buckets(self, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
        """Full (unsharded) tensors, gathered one parameter at a time, in buckets of at most
        ``bucket_bytes`` (a single larger tensor gets a bucket of its own). Collective: every
        rank iterates; only rank 0 yields non-empty buckets. Tied weights are sent once.

        Tensors stay on the learner's device in its parameter dtype and may alias live
        parameters: a consumer copies them before the next optimizer step. Only the bucket
        being built is held, so gathering costs one bucket."""
        bucket: dict[str, torch.Tensor] = {}
        size = 0
        for name, full in self._full_weights():
            if full is None:
                continue
            nbytes = full.numel() * full.element_size()
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = {}, 0
            bucket[name] = full.detach()
            size += nbytes
        if bucket or self.rank != 0:
            yield bucket

    def _named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Parameters (tied ones once, as ``named_parameters`` dedupes) + persistent buffers;
        with LoRA only what trains (the adapters, by wire name; see rlsys/models/lora.py):
        the base never changes, so it never travels."""
        if self.lora is not None:
            return [
                (lora.wire_name(n), p) for n, p in self.module.named_parameters() if p.requires_grad
            ]
        persistent = self.module.state_dict().keys()
        buffers = [(n, b) for n, b in self.module.named_buffers() if n in persistent]
        named = list(self.module.named_parameters()) + buffers
        if self.freeze_vision:  # the engines hold the same frozen tower already
            named = [(n, t) for n, t in named if not n.startswith(VISION_PREFIX)]
        return named

    def save_hf(self, path: str) -> None:
        """Write the policy (or reward model) as a Hugging Face directory (rank 0 writes; all
        ranks gather); a critic has no Hugging Face form."""
        if not self.model_role.hf_form:
            raise ValueError("a critic (role=value) has no Hugging Face form; save a checkpoint")
        state = {}
        for bucket in self.iter_weight_buckets(1 << 30):
            state.update(bucket)
        if self.rank == 0:
            model = self._load_module(for_training=False)
            if self.lora is not None:  # adapters merged into the base: a plain HF model
                state = merged_state(model, state, self.lora.scale)
            model.load_state_dict(state, strict=False)
            out = Path(path)
            if out.exists():
                shutil.rmtree(out)
            save_pretrained(model, out)
            # how a reward model pads: see reward_tokenizer
            save_tokenizer(self.model_path, str(out), self.model_role.padding_side)
        dist.barrier()
