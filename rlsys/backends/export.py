"""Turn a policy's backend checkpoint into a Hugging Face directory, offline: one process,
no torch.distributed, no Ray (e.g. on a login node after the run)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from rlsys.backends import checkpoint as ckpt
from rlsys.models.saving import save_pretrained
from rlsys.registry import Registry

# Per backend (the name in the checkpoint's backend_info.json, as in BACKENDS): the full model
# tensors of a checkpoint directory, read in this one process.
Reader = Callable[[Path], dict[str, torch.Tensor]]
CHECKPOINT_READERS: Registry[Reader] = Registry("backend checkpoint reader", "learner.backend")


@CHECKPOINT_READERS.register("fsdp2")
def _dcp_model_state(root: Path) -> dict[str, torch.Tensor]:
    """The full model tensors of an FSDP2 (DCP) checkpoint, read without a process group."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    ckpt.check_dcp_metadata(root / ckpt.DCP_DIR)
    state: dict = {}
    reader = ckpt.dcp_reader(root / ckpt.DCP_DIR)
    try:
        _load_state_dict(  # what format_utils.dcp_to_torch_save does, model keys only, in memory
            state,
            storage_reader=reader,
            planner=ckpt.safe_load_planner(keys={"model"}),
            no_dist=True,
        )
    except (Exception, CheckpointException) as exc:  # the latter is a BaseException
        raise ckpt.dcp_read_error(root, exc, reader, "export an earlier one") from None
    return state["model"]


@CHECKPOINT_READERS.register("deepspeed")
def _zero_model_state(root: Path) -> dict[str, torch.Tensor]:
    """The fp32 master weights of a DeepSpeed ZeRO-2/3 checkpoint, merged from its shards."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from rlsys.backends.deepspeed import DS_DIR, DS_TAG

    ckpt.check_deepspeed_files(root / DS_DIR / DS_TAG)
    return get_fp32_state_dict_from_zero_checkpoint(str(root / DS_DIR), tag=DS_TAG)


def export_hf(checkpoint_dir: str, out_dir: str, merge: bool = False) -> str:
    """Write the policy in the backend checkpoint ``checkpoint_dir`` as a Hugging Face
    directory ``out_dir`` (weights in the run's dtype + the tokenizer of its model_path),
    loadable with ``AutoModelForCausalLM.from_pretrained``. A LoRA run's checkpoint holds
    only adapters: it is written as a PEFT adapter directory (``PeftModel.from_pretrained``
    on the base, vLLM's ``LoRARequest``), or with ``merge`` as the full model with the
    adapters merged in. Returns what was written: "model" or "adapter"."""
    from rlsys.models.loading import load_model, save_tokenizer

    root = Path(checkpoint_dir)
    info = ckpt.read_json(root, ckpt.BACKEND_INFO)
    if info.get("role") != "policy":
        raise ckpt.BackendCheckpointError(
            f"backend checkpoint {root} holds a {info.get('role')!r} model; export_hf exports "
            "a policy checkpoint (the run's policy/ directory), not a critic's"
        )
    if info.get("backend") not in CHECKPOINT_READERS:
        raise ckpt.BackendCheckpointError(
            f"backend checkpoint {root} names backend {info.get('backend')!r}, not one of "
            f"{CHECKPOINT_READERS.names()}; pass a directory a learner's save_checkpoint wrote"
        )
    reader = CHECKPOINT_READERS.get(info["backend"])
    try:
        state = reader(root)
    except ckpt.BackendCheckpointError:
        raise
    except Exception as exc:
        raise ckpt.BackendCheckpointError(
            f"backend checkpoint {root}: reading its {info['backend']} weights failed "
            f"({ckpt.failure_cause(exc)}); the checkpoint is incomplete or damaged: "
            "export an earlier one"
        ) from exc
    model = load_model(info["model_path"], info["dtype"])
    if info.get("lora"):
        return _export_lora(root, state, info, model, out_dir, merge)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {n for n in missing if n in _tied_names(model)}
    if set(missing) - tied or unexpected:
        raise ckpt.BackendCheckpointError(
            f"backend checkpoint {root} does not match the model at {info['model_path']} "
            f"(missing {sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]}); "
            "export with the model_path the run started from"
        )
    save_pretrained(model, out_dir)
    save_tokenizer(info["model_path"], out_dir)
    return "model"


def _export_lora(root: Path, state: dict, info: dict, model, out_dir: str, merge: bool) -> str:
    """``export_hf`` of a LoRA checkpoint: ``state`` holds the adapters by model name."""
    from rlsys.backends.lora_merge import merged_state
    from rlsys.config.schema import LoraConfig
    from rlsys.models import lora
    from rlsys.models.loading import save_tokenizer

    cfg = LoraConfig(**info["lora"])
    adapters = {lora.wire_name(name): tensor.to(model.dtype) for name, tensor in state.items()}
    try:
        if merge:
            missing = set(lora.split(adapters)[1]) - set(model.state_dict())
            if missing:
                raise KeyError(sorted(missing)[:5])
            model.load_state_dict(merged_state(model, adapters, cfg.scale), strict=False)
        else:
            lora.split(adapters)  # every A has its B
    except (KeyError, ValueError) as exc:
        raise ckpt.BackendCheckpointError(
            f"backend checkpoint {root}: its LoRA adapters do not fit the model at "
            f"{info['model_path']} ({exc}); export with the model_path the run started from"
        ) from exc
    if merge:
        save_pretrained(model, out_dir)
    else:
        lora.save_peft_adapter(out_dir, adapters, cfg, info["model_path"])
    save_tokenizer(info["model_path"], out_dir)
    return "model" if merge else "adapter"


def _tied_names(model: torch.nn.Module) -> set[str]:
    """Parameter names that alias another one (tied embeddings): a checkpoint may omit them."""
    seen: dict[int, str] = {}
    tied = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            tied.add(name)
        else:
            seen[id(param)] = name
    return tied
