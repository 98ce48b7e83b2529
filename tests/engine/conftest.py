"""Fixtures for the engine tests: tiny, seeded, random-init Llama/Qwen2/Qwen3 models."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

T = TypeVar("T")

VOCAB = 96
EOS = 3
COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA
    max_position_embeddings=128,
    eos_token_id=EOS,
    pad_token_id=0,
)


def make_model(kind: str, seed: int = 0) -> PreTrainedModel:
    """A seeded random model; weights scaled up so the distributions are peaked."""
    torch.manual_seed(seed)
    if kind == "llama":  # llama3 RoPE scaling, untied head
        rope = {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        }
        model = LlamaForCausalLM(LlamaConfig(**COMMON, rope_parameters=rope))
    elif kind == "llama_mha":  # default RoPE, no GQA, tied embeddings
        cfg = {**COMMON, "num_key_value_heads": 4, "tie_word_embeddings": True}
        model = LlamaForCausalLM(LlamaConfig(**cfg))
    elif kind == "llama_yarn":  # YaRN RoPE (attention scaling != 1)
        rope = {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 32,
        }
        model = LlamaForCausalLM(LlamaConfig(**COMMON, rope_parameters=rope))
    elif kind == "mistral":
        model = MistralForCausalLM(MistralConfig(**COMMON, sliding_window=None))
    elif kind == "qwen2":  # q/k/v biases, tied embeddings
        model = Qwen2ForCausalLM(Qwen2Config(**COMMON, tie_word_embeddings=True))
    elif kind == "qwen3":  # q/k norms, explicit head_dim
        model = Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=32))
    else:
        raise ValueError(kind)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
            elif p.dim() == 2:
                p.mul_(4.0)
    return model.eval()


@pytest.fixture(scope="module")
def llama() -> PreTrainedModel:
    return make_model("llama")


@pytest.fixture(scope="module")
def qwen2() -> PreTrainedModel:
    return make_model("qwen2")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def hf_logprobs(model: PreTrainedModel, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Raw logprobs of ``tokens`` after ``prompt`` from one HF forward."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
    return lp.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)


def hf_greedy(model: PreTrainedModel, prompt: list[int], new_tokens: int) -> list[int]:
    """HF greedy continuation of exactly ``new_tokens`` tokens (eos suppressed)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=new_tokens,
            eos_token_id=[VOCAB],
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


class CharTokenizer:
    """Decodes id i to one character (enough for stop-string tests)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(ord("!") + i % 90) for i in ids)
