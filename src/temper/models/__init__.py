"""temper.models: loading HF models and tokenizers; the built-in tiny policy, reward model and VLM."""

from temper.models.loader import (
    TINY_DIR,
    TINY_RM_DIR,
    TINY_VLM_DIR,
    is_vision_language,
    load_model,
    load_processor,
    load_tokenizer,
    resolve_model_path,
)

__all__ = [
    "TINY_DIR",
    "TINY_RM_DIR",
    "TINY_VLM_DIR",
    "is_vision_language",
    "load_model",
    "load_processor",
    "load_tokenizer",
    "resolve_model_path",
]
