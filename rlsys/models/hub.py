"""A hub id checked before anything loads it: one bounded request, or the local cache.

``from_pretrained`` on a misspelt or unreachable hub id retried for about 55 s and then raised
a raw ``OSError`` traceback from inside the run; this check answers in seconds, before Ray,
with the key at fault and the fix."""

from __future__ import annotations

import os

from rlsys.config.errors import ConfigError

HUB_TIMEOUT_S = 4.0  # one metadata request; the whole check stays within ~5 s
_OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def _offline() -> bool:
    return any(os.environ.get(name, "").lower() in ("1", "true", "yes") for name in _OFFLINE)


def check_hub_model(repo_id: str, key: str = "model.path", timeout_s: float = HUB_TIMEOUT_S):
    """Raise ConfigError unless ``repo_id`` is a well-formed hub id whose model is in the
    local Hugging Face cache or answers on the hub within ``timeout_s``."""
    from huggingface_hub import HfApi, try_to_load_from_cache
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        RepositoryNotFoundError,
    )
    from huggingface_hub.utils import validate_repo_id

    local_fix = "or pass a local model directory (with config.json)"
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise ConfigError(
            f"{key}={repo_id!r} is neither a local model directory nor a hub id ({exc}); "
            "pass a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct, builtin:tiny, "
            f"{local_fix}"
        ) from None
    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return  # downloaded before: from_pretrained reads the cache, online or not
    if _offline():
        raise ConfigError(
            f"{key}={repo_id!r} is not in the local Hugging Face cache and the hub is off "
            f"({'/'.join(_OFFLINE)} set); download it where there is network, unset the "
            f"variable, {local_fix}"
        )
    try:
        HfApi().model_info(repo_id, timeout=timeout_s)
    except GatedRepoError:
        raise ConfigError(
            f"{key}={repo_id!r} is a gated model: accept its terms on huggingface.co and set "
            f"HF_TOKEN, {local_fix}"
        ) from None
    except RepositoryNotFoundError:
        raise ConfigError(
            f"{key}={repo_id!r}: no such model on the hub (misspelt, or private: set "
            f"HF_TOKEN); check the id, {local_fix}"
        ) from None
    except Exception as exc:  # network: DNS, refused, timeout, proxy, 5xx
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"{key}={repo_id!r} is not in the local Hugging Face cache and the hub did not "
            f"answer within {timeout_s:g} s ({reason}); check the network (HF_ENDPOINT for a "
            f"mirror), set HF_HUB_OFFLINE=1 with a filled cache, {local_fix}"
        ) from None
