"""LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"),
built by PEFT, and the one form they travel and are stored in.

A learner injects adapters into its model in place (``peft.inject_adapter_in_model``: the
model keeps its class, ``generate`` and module paths; a wrapped linear's base weight becomes
``<module>.base_layer.weight`` and its adapter ``<module>.lora_A.default.weight``) and trains
only them. What leaves the learner (weight sync, ``save_hf``) is named the way PEFT saves an
adapter, without PEFT's wrapper prefix: ``<module>.lora_A.weight`` (r, in) and
``<module>.lora_B.weight`` (out, r) — the *wire* names. A receiver turns them back into full
weights with ``merge``: ``W = W0 + (alpha / r) * B @ A``, what PEFT's merge computes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from rlsys.config.schema import LoraConfig

ADAPTER = "default"  # PEFT's adapter name inside the model
_PARTS = (".lora_A.", ".lora_B.")
PEFT_PREFIX = "base_model.model."  # what PEFT puts before module paths in adapter files


def peft_config(cfg: LoraConfig):
    """``cfg`` as PEFT's ``LoraConfig`` (no bias, plain scaling alpha / r)."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
    )


def add_adapters(
    model: torch.nn.Module, cfg: LoraConfig, trainable: Iterable[str] = ()
) -> torch.nn.Module:
    """Inject ``cfg``'s adapters into ``model`` in place and freeze everything else except
    the modules named in ``trainable`` (a reward model's score head, trained in full).
    Raises ``ValueError`` naming ``model.lora.target_modules`` when nothing matches."""
    from peft import inject_adapter_in_model

    try:
        # A is random (B starts at 0): from a fixed seed, so every rank of a learner, and
        # every run, starts from the same adapters whatever else drew random numbers before
        with torch.random.fork_rng():
            torch.manual_seed(0)
            inject_adapter_in_model(peft_config(cfg), model, adapter_name=ADAPTER)
    except ValueError as exc:
        raise ValueError(
            f"model.lora.target_modules={list(cfg.target_modules)} matched no linear module "
            f"of the model ({exc}); name the model's attention/MLP linear layers"
        ) from exc
    heads = tuple(trainable)
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter(name) or name.startswith(heads))
    return model


def is_adapter(name: str) -> bool:
    """Whether parameter ``name`` (model or wire name) is a LoRA A or B matrix."""
    return any(part in name for part in _PARTS)


def wire_name(name: str) -> str:
    """The model's parameter name as it travels: PEFT's adapter name dropped from adapter
    weights (``q_proj.lora_A.default.weight`` -> ``q_proj.lora_A.weight``)."""
    for part in _PARTS:
        name = name.replace(f"{part}{ADAPTER}.", part)
    return name


@contextlib.contextmanager
def adapters_off(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` as its base model: every adapter skipped (the reference policy of a LoRA
    run is the learner itself inside this block)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def no_input_casts(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """A block in which adapters take their input in its own dtype (under autocast, which
    picks the matmul dtype itself) instead of PEFT casting it to the adapter weights'."""
    from peft.helpers import disable_input_dtype_casting

    return disable_input_dtype_casting(model)


def split(state: dict[str, torch.Tensor]) -> tuple[dict[str, tuple], dict[str, torch.Tensor]]:
    """Wire-named tensors -> ({module: (A, B)}, the other (full) tensors by name)."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    rest = {}
    for name, tensor in state.items():
        for part in _PARTS:
            if part in name:
                module = name.split(part)[0]
                pairs.setdefault(module, {})[part] = tensor
                break
        else:
            rest[name] = tensor
    incomplete = [m for m, p in pairs.items() if len(p) != 2]
    if incomplete:
        raise ValueError(f"LoRA weights of {incomplete[:3]} lack their A or B matrix")
    return {m: (p[".lora_A."], p[".lora_B."]) for m, p in pairs.items()}, rest


def merge(
    base: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scale: float,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``base + scale * b @ a``, computed in fp32 on ``device`` (default: ``base``'s), in
    ``base``'s dtype. The three may arrive on different devices (adapters through a GPU
    transport, the base from host memory): each moves to ``device`` first."""
    device = base.device if device is None else torch.device(device)
    delta = b.to(device, torch.float32) @ a.to(device, torch.float32)
    return (base.to(device, torch.float32) + scale * delta).to(base.dtype)


class AdapterMerger:
    """Engine side of adapter-only weight sync: keeps the base weights of every module that
    has an adapter (read once from the model's safetensors files, in ``dtype``) and turns
    adapter buckets into full weights by Hugging Face name for the engine to load.

    Only adapters travel; the base never changes, so each sync's weights are merged into the
    pristine base, never into the previous merge (no drift over thousands of syncs)."""

    def __init__(
        self, model_path: str, dtype: str, scale: float, device: torch.device | str = "cpu"
    ) -> None:
        """``device``: the engine's, where merged weights are computed and returned (the
        base stays in host memory; adapters may arrive on any device)."""
        self.model_path, self.scale = model_path, scale
        self.device = torch.device(device)
        self.dtype = getattr(torch, dtype)
        self.base: dict[str, torch.Tensor] = {}

    def __call__(self, buckets: Iterable[dict[str, torch.Tensor]]) -> Iterator[dict]:
        """Full-weight buckets for ``buckets`` of wire-named adapter tensors (an A and its
        B may arrive in different buckets: held until both are there)."""
        waiting: dict[str, torch.Tensor] = {}
        for bucket in buckets:
            full = {}
            for name, tensor in bucket.items():
                if not is_adapter(name):
                    full[name] = tensor
                    continue
                waiting[name] = tensor.detach().clone()  # the bucket is reused after this
            pairs = _complete(waiting)
            missing = [f"{m}.weight" for m in pairs if f"{m}.weight" not in self.base]
            if missing:
                self.base.update(read_safetensors(self.model_path, missing, self.dtype))
            for module, (a, b) in pairs.items():
                base = self.base[f"{module}.weight"]
                full[f"{module}.weight"] = merge(base, a, b, self.scale, self.device)
                del waiting[f"{module}.lora_A.weight"], waiting[f"{module}.lora_B.weight"]
            if full:
                yield full
        if waiting:
            raise ValueError(f"LoRA weights {sorted(waiting)[:3]} arrived without their pair")


def _complete(waiting: dict[str, torch.Tensor]) -> dict[str, tuple]:
    """{module: (A, B)} for every module both of whose matrices are in ``waiting``."""
    pairs = {}
    for name in waiting:
        if ".lora_A." in name:
            module = name.split(".lora_A.")[0]
            b = waiting.get(f"{module}.lora_B.weight")
            if b is not None:
                pairs[module] = (waiting[name], b)
    return pairs


def read_safetensors(model_path: str, names: list[str], dtype: torch.dtype) -> dict:
    """Tensors ``names`` from the safetensors files of the model at ``model_path`` (a
    directory, or a hub id already in the local cache), cast to ``dtype``. Never reads a
    pickle-based ``.bin`` file (it could run code)."""
    from safetensors import safe_open

    root = Path(os.path.expanduser(model_path))
    if not root.is_dir():
        from huggingface_hub import snapshot_download

        root = Path(snapshot_download(model_path, allow_patterns=["*.safetensors", "*.json"]))
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"model {model_path} has no .safetensors weights: LoRA weight sync reads the base "
            "weights from them (pickle .bin files are never read); re-save the model with "
            "save_pretrained(safe_serialization=True)"
        )
    wanted, out = set(names), {}
    for path in files:
        with safe_open(str(path), framework="pt") as fh:
            for name in wanted & set(fh.keys()):
                out[name] = fh.get_tensor(name).to(dtype)
    absent = wanted - set(out)
    if absent:
        raise KeyError(
            f"model {model_path} has no weights {sorted(absent)[:3]} for the LoRA adapters the "
            "learner sent; the engines and learner must start from the same model.path"
        )
    return out


# ---- PEFT-format adapter directories (rlsys export) ------------------------------------------


def save_peft_adapter(
    out_dir: str, state: dict[str, torch.Tensor], cfg: LoraConfig, base_model: str
) -> None:
    """Write wire-named adapter tensors as a PEFT adapter directory (``adapter_config.json``,
    ``adapter_model.safetensors``), loadable by ``PeftModel.from_pretrained`` and vLLM's
    ``LoRARequest``."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = peft_config(cfg)
    config.base_model_name_or_path = base_model
    config.save_pretrained(str(out))
    tensors = {PEFT_PREFIX + name: t.contiguous() for name, t in state.items()}
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
