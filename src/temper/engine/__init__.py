"""temper.engine: generation engines behind one protocol (token ids in, token ids + logprobs out).

`build_engine` picks an implementation by name: ``"native"`` (`NativeEngine`,
the PyTorch engine with a slot KV cache and continuous batching), ``"hf"``
(`HFEngine`, Hugging Face ``model.generate``, the baseline) or ``"openai"``
(`OpenAIEndpointEngine`, a remote OpenAI-compatible completions endpoint; no
local model, no weight updates) or ``"vllm"`` (`VLLMEngine`, vLLM in this
process; it loads ``model_path`` itself, so ``model`` is None).
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

ENGINE_TYPES = ("native", "hf", "vllm", "openai")


def build_engine(
    kind: str, model: torch.nn.Module | None, tokenizer: Any | None = None, **opts: Any
) -> Engine:
    """Build the engine named ``kind`` around an in-memory HF model.

    ``opts`` go to the engine's constructor: for ``"native"`` ``max_slots``,
    ``max_context``, ``dtype``, ``max_prefill_tokens``, ``prefix_cache_mb``, ``seed``,
    ``cpu_kernels``; for ``"hf"``
    ``max_context``; for ``"vllm"`` ``model_path`` (required) and `VLLMEngine`'s
    keyword arguments; for ``"openai"`` ``base_url`` (required), ``model_name``,
    ``api_key``, ``timeout_s`` (``model`` is then None: nothing runs locally).
    An unknown ``kind`` raises `ConfigError`; a model the native engine cannot
    run raises `UnsupportedModelError`.
    """
    if kind == "openai":
        from temper.engine.openai_endpoint import OpenAIEndpointEngine

        if not opts.get("base_url"):
            raise ConfigError("engine.base_url is required when engine.type = 'openai'")
        return OpenAIEndpointEngine(opts.pop("base_url"), tokenizer, **opts)
    if kind == "vllm":
        from temper.engine.vllm_engine import VLLMEngine

        if not opts.get("model_path"):
            raise ConfigError("engine.type = 'vllm' needs model_path (vLLM loads the model)")
        return VLLMEngine(opts.pop("model_path"), tokenizer, **opts)
    if model is None:
        raise ConfigError(f"engine.type = {kind!r} needs a model")
    if kind == "native":
        from temper.engine.native import NativeEngine

        return NativeEngine(model, tokenizer, **opts)
    if kind == "hf":
        from temper.engine.hf import HFEngine

        return HFEngine(model, tokenizer, **opts)
    raise ConfigError(f"engine.type must be one of {', '.join(ENGINE_TYPES)}, got {kind!r}")
