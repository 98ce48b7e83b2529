"""Engines from their config: one builder per ``engine.type`` (`temper.config.engine`).

Training, eval, serving and rollout workers all build their engine here. The
native and HF engines run a copy of the model loaded here (in ``model.dtype``,
on ``engine.device``); vLLM loads its own; the OpenAI endpoint runs nothing
locally and keeps only the tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from temper.builder.model import RunModel
from temper.config import Config
from temper.config.engine import (
    HFEngineConfig,
    NativeEngineConfig,
    OpenAIEngineConfig,
    VLLMEngineConfig,
)
from temper.devices import resolve_device
from temper.engine.base import Engine
from temper.errors import ConfigError
from temper.http_client import api_key_from_env
from temper.models import load_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _local_model(cfg: Config, model: RunModel, device: str) -> torch.nn.Module:
    """The engine's own copy of the weights, in ``model.dtype`` on ``device``."""
    weights = load_model(model.weights, dtype=DTYPES[cfg.model.dtype])
    return weights.to(resolve_device(device, "engine.device"))


def _native(cfg: Config, e: NativeEngineConfig, model: RunModel) -> Engine:
    from temper.engine.native import NativeEngine

    return NativeEngine(
        _local_model(cfg, model, e.device),
        model.tokenizer,
        max_slots=e.max_slots,
        prefix_cache_mb=e.prefix_cache_mb,
        cpu_kernels=e.cpu_kernels,
        vision=model.vision,
    )


def _hf(cfg: Config, e: HFEngineConfig, model: RunModel) -> Engine:
    from temper.engine.hf import HFEngine

    return HFEngine(_local_model(cfg, model, e.device), model.tokenizer, vision=model.vision)


def _vllm(cfg: Config, e: VLLMEngineConfig, model: RunModel) -> Engine:
    from temper.engine.vllm_engine import VLLMEngine

    return VLLMEngine(
        model.weights,
        model.tokenizer,
        dtype=cfg.model.dtype,
        device=resolve_device(e.device, "engine.device").type,
        seed=cfg.run.seed,
        prefix_caching=e.prefix_caching,
        kv_cache_gb=e.kv_cache_gb,
        gpu_memory_utilization=e.gpu_memory_utilization,
        enable_sleep=e.sleep,
        max_num_seqs=e.max_slots,
        # [lora]: adapter updates as vLLM LoRAs; requests in flight keep theirs.
        adapter_versions=cfg.orchestrator.max_staleness + 1 if cfg.lora.enabled else 0,
        max_lora_rank=cfg.lora.rank or 16,
    )


def _openai(cfg: Config, e: OpenAIEngineConfig, model: RunModel) -> Engine:
    from temper.engine.openai_endpoint import OpenAIEndpointEngine

    return OpenAIEndpointEngine(
        e.base_url,
        model.tokenizer,
        model_name=e.model_name,
        api_key=api_key_from_env(e.api_key_env),
        timeout_s=e.timeout_s,
    )


#: ``engine.type`` -> its builder, ``(run config, engine config, model) -> Engine``.
ENGINE_BUILDERS: dict[str, Callable[[Config, Any, RunModel], Engine]] = {
    "native": _native,
    "hf": _hf,
    "vllm": _vllm,
    "openai": _openai,
}


def build_engine(cfg: Config, model: RunModel) -> Engine:
    """The engine ``cfg.engine`` names, for ``model``."""
    return ENGINE_BUILDERS[cfg.engine.type](cfg, cfg.engine, model)


def run_response_limits(cfg: Config) -> dict[str, int | None]:
    """The response limits a training run sets: config key -> value (None: not set)."""
    return {
        "orchestrator.max_response_tokens": cfg.orchestrator.max_response_tokens,
        "eval.max_response_tokens": cfg.eval.max_response_tokens,
    }


def check_response_fits(limits: dict[str, int | None], max_context: int) -> None:
    """Refuse a response limit the engine's context cannot hold next to a prompt (of at
    least one token): one line naming the key, its value and the context."""
    for key, value in limits.items():
        if value is not None and value >= max_context:
            raise ConfigError(
                f"{key} = {value} does not fit the model's context of {max_context} tokens "
                f"(the prompt needs at least one): set it below {max_context}"
            )
