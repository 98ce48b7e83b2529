"""Native engine vs Hugging Face `model.generate`: sampled tokens per second.

Same model, same prompts, in one process: 64 prompts of 8-32 tokens, 64 new
tokens each, temperature 1.0 with no top-k/top-p, end-of-sequence ignored, fp32,
2 CPU threads (`--threads`). The model is the HF model directory given by
`--model`, else the built-in tiny model when `src/temper/models/tiny/` holds
one, else a seeded random Llama of about 3M parameters (hidden 256, 4 layers,
4 heads, vocab 1024).

HF runs one batched `model.generate` call (left padding). Both run on the same
OS thread, Temper's compute thread (`temper.compute`), so neither pays for the
other's OpenMP thread pool. The native engine gets
the 64 prompts as 64 concurrent `generate` requests (n=1 each), i.e. through its
scheduler, the way a rollout uses it. After a warmup of each, the two are timed
alternately `--reps` times. Prints one JSON line; `ratio` is the median native
tokens/s over the median HF tokens/s (higher is better for Temper). On a shared
machine wall time swings with the load; `cpu_ratio` (HF process CPU seconds
over native process CPU seconds, medians) is steadier.

    .venv/bin/python benchmarks/engine_vs_hf.py [--model PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import time
from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from temper import compute
from temper.engine.base import SamplingParams
from temper.engine.native import NativeEngine

TINY_DIR = Path(__file__).resolve().parents[1] / "src" / "temper" / "models" / "tiny"


def load_model(path: str | None = None) -> tuple[PreTrainedModel, str]:
    """The model at ``path`` if given, else the built-in tiny model if present, else a
    seeded random ~3M-parameter Llama."""
    from transformers import AutoModelForCausalLM

    if path is not None:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return model.eval(), f"path:{path}"
    if (TINY_DIR / "config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(TINY_DIR, dtype=torch.float32)
        return model.eval(), "builtin:tiny"
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=2,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval(), "random-llama"


def make_prompts(batch: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, 33, (batch,), generator=g).tolist()
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def time_hf(model: PreTrainedModel, prompts: list[list[int]], new_tokens: int) -> float:
    """Seconds for one batched, left-padded, sampled `model.generate` call."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,  # = ignore_eos: every row yields exactly new_tokens
        pad_token_id=0,
        eos_token_id=model.generation_config.eos_token_id,
    )

    def run() -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(input_ids=ids, attention_mask=mask, generation_config=config)

    start = time.perf_counter()
    # On the same OS thread as the native engine's steps (see `temper.compute`):
    # a second thread running torch ops would slow both sides down.
    out = compute.run(run)
    seconds = time.perf_counter() - start
    assert out.shape[1] - width == new_tokens, out.shape
    return seconds


def time_native(engine: NativeEngine, prompts: list[list[int]], new_tokens: int, rep: int) -> float:
    """Seconds for all prompts as concurrent requests through the native engine."""

    async def run() -> float:
        start = time.perf_counter()
        results = await asyncio.gather(
            *[
                engine.generate(
                    p,
                    SamplingParams(
                        temperature=1.0,
                        max_new_tokens=new_tokens,
                        ignore_eos=True,
                        seed=rep * 1000 + i,
                    ),
                )
                for i, p in enumerate(prompts)
            ]
        )
        seconds = time.perf_counter() - start
        assert all(len(r.samples[0].token_ids) == new_tokens for r in results)
        return seconds

    return asyncio.run(run())


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--model", default=None, help="HF model dir (default: the built-in tiny model, if shipped)"
    )
    args = parser.parse_args()

    compute.set_threads(args.threads)
    model, name = compute.run(load_model, args.model)
    prompts = make_prompts(args.batch, model.config.vocab_size)
    # No prefix cache: every rep re-sends the same prompts, which it would serve from
    # the previous rep's keys/values; HF has nothing alike, and rollouts rarely repeat.
    engine = NativeEngine(model, max_slots=max(256, args.batch), prefix_cache_mb=0)
    tokens = args.batch * args.new_tokens

    time_hf(model, prompts, args.new_tokens)  # warmup
    time_native(engine, prompts, args.new_tokens, rep=0)
    hf_s, native_s, hf_cpu, native_cpu = [], [], [], []
    for rep in range(args.reps):
        start = cpu_seconds()
        hf_s.append(time_hf(model, prompts, args.new_tokens))
        hf_cpu.append(cpu_seconds() - start)
        start = cpu_seconds()
        native_s.append(time_native(engine, prompts, args.new_tokens, rep=rep + 1))
        native_cpu.append(cpu_seconds() - start)
    hf_tok_s = tokens / statistics.median(hf_s)
    native_tok_s = tokens / statistics.median(native_s)
    print(
        json.dumps(
            {
                "native_tok_s": round(native_tok_s, 1),
                "hf_tok_s": round(hf_tok_s, 1),
                "ratio": round(native_tok_s / hf_tok_s, 3),
                "best_ratio": round(min(hf_s) / min(native_s), 3),
                "cpu_ratio": round(statistics.median(hf_cpu) / statistics.median(native_cpu), 3),
                "model": name,
                "params": sum(p.numel() for p in model.parameters()),
                "batch": args.batch,
                "new_tokens": args.new_tokens,
                "reps": args.reps,
                "threads": args.threads,
                "native_s": [round(s, 4) for s in native_s],
                "hf_s": [round(s, 4) for s in hf_s],
                "load_avg_1m": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
