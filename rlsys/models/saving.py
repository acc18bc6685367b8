"""Write a model as a Hugging Face directory without importing DeepSpeed into a process that
does not use it.

``PreTrainedModel.save_pretrained`` unwraps the model with accelerate's
``extract_model_from_parallel``, which imports DeepSpeed whenever it is installed, only to ask
whether the model is a ``DeepSpeedEngine``. In a process that never touched DeepSpeed (an
FSDP learner, a command) that import cost 1.3-1.4 s of a 2-core EPYC a save (measured after
torch and transformers were loaded) and brought DeepSpeed's accelerator probing with it. No object can be a ``DeepSpeedEngine`` while the ``deepspeed`` module was never
imported, so the question is answered without the import there; where DeepSpeed is loaded
(its learner backend) the save runs unchanged.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def _deepspeed_unasked() -> Iterator[None]:
    """While inside, accelerate's unwrapping does not import DeepSpeed, if it is not loaded."""
    try:
        import accelerate.utils.other as unwrap
    except ImportError:  # no accelerate: transformers unwraps by itself, without DeepSpeed
        yield
        return
    if "deepspeed" in sys.modules or not hasattr(unwrap, "is_deepspeed_available"):
        yield
        return
    original = unwrap.is_deepspeed_available
    unwrap.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        unwrap.is_deepspeed_available = original


def save_pretrained(model, out_dir: str | Path, **kwargs) -> None:
    """``model.save_pretrained(out_dir, **kwargs)``, without the DeepSpeed import above."""
    with _deepspeed_unasked():
        model.save_pretrained(out_dir, **kwargs)
