"""temper.models: loading HF models and tokenizers, chat templates and the tool-call format;
the built-in tiny policy (`tiny/`), reward model (`tiny_rm/`), VLM (`tiny_vlm/`) and MoE
(`tiny_moe/`).

`loader.py` (model paths and aliases, `load_model`, `load_tokenizer`,
`load_processor`), `chat_template.py` (the ChatML/Hermes template;
`IncrementalRenderer` renders a conversation piece by piece, so sampled ids are
never re-tokenised), `templates.py` (``model.chat_template``: the tokenizer's own
template, ``raw`` plain text for base models, a built-in one, or a ``.jinja`` file),
`tool_calls.py` (the Hermes ``<tool_call>`` format parsed into `ToolCall`s and
`ToolCallError`s), `vlm_parts.py` (the name prefixes of a VLM's vision tower and
projector).
"""

import importlib
from typing import Any

# Lent lazily (PEP 562): `temper.models.tool_calls` and `chat_template` are light and
# imported by envs and servers that load no model; `loader` pulls in torch and
# transformers (seconds), so it loads on first use of one of these names.
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


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("temper.models.loader"), name)
    raise AttributeError(f"module 'temper.models' has no attribute {name!r}")
