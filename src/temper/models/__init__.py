"""temper.models: loading HF causal LMs and tokenizers; the built-in tiny model."""

from temper.models.loader import TINY_DIR, load_model, load_tokenizer, resolve_model_path

__all__ = ["TINY_DIR", "load_model", "load_tokenizer", "resolve_model_path"]
