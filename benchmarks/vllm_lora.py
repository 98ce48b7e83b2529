"""vLLM's decode speed with a LoRA adapter applied against the same weights merged.

Runs in ``.venv-vllm``. The model is `benchmarks/lora.py`'s ~95M-parameter random
model of the built-in architecture, saved to a temporary directory with the tiny
model's tokenizer. The adapter is what a `[lora]` trainer publishes
(`temper.weights.adapter`: A and scaled B on every linear layer of attention and
MLP), random at ``--rank``. In one run:

- **Temper's path**: a `VLLMEngine` with adapter versions on, given the adapter as
  a weight update (`engine/vllm_lora.py` loads it as one of vLLM's LoRA adapters, so
  every forward runs vLLM's LoRA kernels beside the base weights);
- **the baseline**: a plain `VLLMEngine` on the model with ``W0 + B A`` merged into
  its weights (what a merge-first design would serve).

Each decodes 4 prompts x ``--rows`` samples x ``--tokens`` tokens, best of
``--reps``, after one warm-up call; the two engines' greedy logprobs are checked
against each other first. Prints one JSON line (``applied_over_merged``: the
adapter's tokens/s over the merged weights'; the issue's goal is >= 0.9).

    .venv-vllm/bin/python benchmarks/vllm_lora.py [--rank 8] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

from temper.engine.base import SamplingParams
from temper.engine.vllm_engine import VLLMEngine
from temper.models.loader import TINY_DIR, load_tokenizer
from temper.weights import push_weights
from temper.weights.adapter import LORA_A, LORA_B, merge_into

LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPTS = [[5 + i, 6, 7, 8, 9, 10, 11, 12] for i in range(4)]


def adapter(model: torch.nn.Module, rank: int, seed: int = 1) -> dict[str, torch.Tensor]:
    """A random adapter on every linear layer of attention and MLP, scaled so that it
    moves the logits visibly (the speed does not depend on the values)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in LAYERS:
            out[name + LORA_A] = torch.randn(rank, module.in_features, generator=g) * 0.05
            out[name + LORA_B] = torch.randn(module.out_features, rank, generator=g) * 0.05
    return out


def save(model: torch.nn.Module, directory: Path) -> str:
    model.save_pretrained(directory)
    for file in Path(TINY_DIR).iterdir():  # the tokenizer's files
        if "token" in file.name or file.name == "special_tokens_map.json":
            shutil.copy(file, directory / file.name)
    return str(directory)


async def _decode(engine: VLLMEngine, rows: int, tokens: int) -> float:
    params = SamplingParams(n=rows, max_new_tokens=tokens, seed=1, ignore_eos=True)
    t0 = time.perf_counter()
    await asyncio.gather(*[engine.generate(p, params) for p in PROMPTS])
    return len(PROMPTS) * rows * tokens / (time.perf_counter() - t0)


def measure(engine: VLLMEngine, args: argparse.Namespace) -> tuple[float, list[float]]:
    """Best tokens/s of ``args.reps`` decodes (after a warm-up), and greedy logprobs."""
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True)
    sample = asyncio.run(engine.generate(PROMPTS[0], greedy)).samples[0]
    asyncio.run(_decode(engine, args.rows, 4))  # warm-up
    speeds = [asyncio.run(_decode(engine, args.rows, args.tokens)) for _ in range(args.reps)]
    return max(speeds), list(zip(sample.token_ids, sample.logprobs, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--intermediate", type=int, default=3072)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--rows", type=int, default=8, help="samples per request (4 requests)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens each sample decodes")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    # After temper's imports: in .venv-vllm temper hides the CUDA torchvision that vLLM
    # pulls in, which transformers (imported by benchmarks/lora.py) would trip over.
    from lora import random_model  # the same ~95M-parameter model

    tokenizer = load_tokenizer(TINY_DIR)
    with tempfile.TemporaryDirectory(prefix="temper-vllm-lora-") as tmp:
        base = random_model(args)
        update = adapter(base, args.rank)
        base_dir = save(base, Path(tmp) / "base")
        merged_dir = save(merge_into(base, update), Path(tmp) / "merged")
        engine = VLLMEngine(base_dir, tokenizer, adapter_versions=2, max_lora_rank=args.rank)
        try:
            push_weights(engine, update, 1)
            applied, applied_greedy = measure(engine, args)
        finally:
            asyncio.run(engine.close())
        engine = VLLMEngine(merged_dir, tokenizer)
        try:
            plain, merged_greedy = measure(engine, args)
        finally:
            asyncio.run(engine.close())
    shared = [(a, b) for a, b in zip(applied_greedy, merged_greedy, strict=True) if a[0] == b[0]]
    print(
        json.dumps(
            {
                "benchmark": "vllm_lora",
                "rank": args.rank,
                "params_m": round(sum(p.numel() for p in base.parameters()) / 1e6, 2),
                "applied_tokens_per_s": round(applied, 1),
                "merged_tokens_per_s": round(plain, 1),
                "applied_over_merged": round(applied / plain, 3),
                "greedy_tokens_equal": len(shared),
                "greedy_logprob_gap": max((abs(a[1] - b[1]) for a, b in shared), default=None),
            }
        )
    )


if __name__ == "__main__":
    main()
