"""temper.engine: generation engines behind one protocol (token ids in, token ids + logprobs out).

`build_engine` picks an implementation by name: ``"native"`` (`NativeEngine`,
the PyTorch engine with a slot KV cache and continuous batching) or ``"hf"``
(`HFEngine`, Hugging Face ``model.generate``, the baseline).
"""

from __future__ import annotations

from typing import Any

import torch

from temper.engine.base import Engine, GenerationResult, SampleOutput, SamplingParams
from temper.errors import ConfigError

__all__ = [
    "ENGINE_TYPES",
    "Engine",
    "GenerationResult",
    "SampleOutput",
    "SamplingParams",
    "build_engine",
]

ENGINE_TYPES = ("native", "hf")


def build_engine(
    kind: str, model: torch.nn.Module, tokenizer: Any | None = None, **opts: Any
) -> Engine:
    """Build the engine named ``kind`` around an in-memory HF model.

    ``opts`` go to the engine's constructor: for ``"native"`` ``max_slots``,
    ``max_context``, ``dtype``, ``max_prefill_tokens``, ``seed``; for ``"hf"``
    ``max_context``. An unknown ``kind`` raises `ConfigError`; a model the
    native engine cannot run raises `UnsupportedModelError`.
    """
    if kind == "native":
        from temper.engine.native import NativeEngine

        return NativeEngine(model, tokenizer, **opts)
    if kind == "hf":
        from temper.engine.hf import HFEngine

        return HFEngine(model, tokenizer, **opts)
    raise ConfigError(f"engine.type must be one of {', '.join(ENGINE_TYPES)}, got {kind!r}")
