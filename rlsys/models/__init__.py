"""Model and tokenizer loading."""

from rlsys.models.loading import load_model, load_tokenizer, resolve_model_path

__all__ = ["load_model", "load_tokenizer", "resolve_model_path"]
