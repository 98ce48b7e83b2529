"""Engines side by side: native, vLLM (raw and through Temper) and HF `generate`.

Run it in the vLLM environment (`make setup-vllm`):

    .venv-vllm/bin/python benchmarks/engines.py

Workload (the engine issue's): 64 prompts of 8-32 tokens, 64 new tokens each,
temperature 1, fp32, on two models of the same (Llama) architecture: the built-in
tiny model and a ~25M-parameter model initialised at random from a config in code.

- tokens/s of each engine (one timed round after a warm-up round);
- ``temper_vllm_over_raw``: Temper's `VLLMEngine` against the same `LLMEngine`
  driven directly (``add_request`` + ``step``, what ``vllm.LLM.generate`` does), so
  the ratio is Temper's own overhead (the target is >= 0.9);
- the seconds per weight update into vLLM and into the native engine (25M model);
- the GRPO step time with each engine: `temper train` on the tiny model, the
  median ``time_step_s`` of steps 2-4.

vLLM, once started in a process, pins threads and changes its environment, so
native and HF are measured first, then vLLM. Prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from temper import compute
from temper.engine.base import SamplingParams
from temper.engine.hf import HFEngine
from temper.engine.native import NativeEngine
from temper.models import load_model, load_tokenizer, resolve_model_path
from temper.weights import push_weights

PROMPTS, NEW_TOKENS = 64, 64


def make_25m_model(root: Path) -> Path:
    """A ~25M-parameter Llama with the tiny model's tokenizer, random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tiny = resolve_model_path("tiny")
    tok = load_tokenizer(str(tiny))
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    out = root / "llama-25m"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def workload(vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(8, 32))] for _ in range(PROMPTS)]


def params(i: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS, ignore_eos=True, seed=i)


async def temper_round(engine, prompts) -> float:
    t0 = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(p, params(i)) for i, p in enumerate(prompts)))
    dt = time.perf_counter() - t0
    return sum(len(s.token_ids) for r in results for s in r.samples) / dt


def tokens_per_s(engine, prompts) -> float:
    asyncio.run(temper_round(engine, prompts))  # warm-up
    return asyncio.run(temper_round(engine, prompts))


def raw_vllm_round(llm, prompts) -> float:
    """The same requests straight into vLLM's `LLMEngine` (what `LLM.generate` does)."""
    from vllm.inputs import TokensPrompt

    from temper.engine.vllm_engine import _vllm_params

    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        llm.add_request(
            f"raw{i}-{t0}",
            TokensPrompt(prompt_token_ids=p),
            _vllm_params(params(i), 0, NEW_TOKENS, 0),
        )
    tokens = 0
    while llm.has_unfinished_requests():
        tokens += sum(len(o.outputs[0].token_ids) for o in llm.step() if o.finished)
    return tokens / (time.perf_counter() - t0)


def update_seconds(engine, model_path: str) -> float:
    state = load_model(model_path).state_dict()
    t0 = time.perf_counter()
    for _ in range(3):
        push_weights(engine, state, engine.version + 1)
    return (time.perf_counter() - t0) / 3


def grpo_step_s(engine_type: str, root: Path) -> float:
    from temper.cli.main import main

    name = f"grpo-{engine_type}"
    argv = [
        "train",
        f"--run.output_dir={root}",
        f"--run.name={name}",
        f"--engine.type={engine_type}",
        "--orchestrator.steps=4",
        "--eval.at_start=false",
        "--eval.at_end=false",
        "--eval.every=0",
        "--log.progress=false",
        "--checkpoint.at_end=false",
    ]
    assert main(argv) == 0
    lines = (root / name / "metrics.jsonl").read_text().splitlines()
    return statistics.median(json.loads(x)["time_step_s"] for x in lines[1:])


def main() -> None:
    compute.set_threads(2)
    root = Path(tempfile.mkdtemp(prefix="temper-bench-engines-"))
    models = {"tiny": str(resolve_model_path("tiny")), "25m": str(make_25m_model(root))}
    out: dict = {"benchmark": "engines", "prompts": PROMPTS, "new_tokens": NEW_TOKENS}
    for name, path in models.items():
        tok = load_tokenizer(path)
        prompts = workload(len(tok))
        model = load_model(path)
        native = NativeEngine(model, tok, seed=0)
        out[f"{name}_native_tok_s"] = tokens_per_s(native, prompts)
        if name == "25m":
            out["25m_native_update_s"] = update_seconds(native, path)
        asyncio.run(native.close())
        hf = HFEngine(model, tok)
        out[f"{name}_hf_tok_s"] = tokens_per_s(hf, prompts)
        asyncio.run(hf.close())
    out["tiny_grpo_step_s_native"] = grpo_step_s("native", root)
    out["tiny_grpo_step_s_hf"] = grpo_step_s("hf", root)
    try:
        from temper.engine.vllm_engine import VLLMEngine
    except ImportError:
        print("vLLM is not installed: run in .venv-vllm (make setup-vllm)", file=sys.stderr)
        raise SystemExit(2) from None
    for name, path in models.items():
        tok = load_tokenizer(path)
        prompts = workload(len(tok))
        engine = VLLMEngine(path, tok)
        raw_vllm_round(engine._llm, prompts)  # warm-up
        temper = [tokens_per_s(engine, prompts)]
        raw = [compute.run(raw_vllm_round, engine._llm, prompts)]
        temper.append(asyncio.run(temper_round(engine, prompts)))
        raw.append(compute.run(raw_vllm_round, engine._llm, prompts))
        out[f"{name}_vllm_raw_tok_s"] = max(raw)
        out[f"{name}_vllm_temper_tok_s"] = max(temper)
        out[f"{name}_temper_vllm_over_raw"] = max(temper) / max(raw)
        if name == "25m":
            out["25m_vllm_update_s"] = update_seconds(engine, path)
        asyncio.run(engine.close())
        out[f"{name}_native_over_hf"] = out[f"{name}_native_tok_s"] / out[f"{name}_hf_tok_s"]
        out[f"{name}_vllm_over_hf"] = out[f"{name}_vllm_temper_tok_s"] / out[f"{name}_hf_tok_s"]
    out["tiny_grpo_step_s_vllm"] = grpo_step_s("vllm", root)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}))


if __name__ == "__main__":
    main()
