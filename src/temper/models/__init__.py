"""temper.models: loading HF models and tokenizers; the built-in tiny policy and reward model."""

from temper.models.loader import (
    TINY_DIR,
    TINY_RM_DIR,
    load_model,
    load_tokenizer,
    resolve_model_path,
)

__all__ = ["TINY_DIR", "TINY_RM_DIR", "load_model", "load_tokenizer", "resolve_model_path"]
