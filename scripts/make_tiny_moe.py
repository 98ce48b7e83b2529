"""Write the built-in tiny mixture-of-experts model (`tiny-moe`) to
src/temper/models/tiny_moe/: a two-layer Qwen3-MoE (transformers' own class) with
4 experts per layer, 2 routed per token, on the tiny model's tokenizer, with random
weights (seed 0). It exists for the expert-parallel tests (docs/scaling.md): what it
computes is meaningless, what matters is that it is a real MoE that loads with
`AutoModelForCausalLM`.

    .venv/bin/python scripts/make_tiny_moe.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

MODELS = Path(__file__).resolve().parents[1] / "src" / "temper" / "models"


def main() -> None:
    out = MODELS / "tiny_moe"
    tiny = MODELS / "tiny"
    tiny_config = json.loads((tiny / "config.json").read_text())
    config = Qwen3MoeConfig(
        vocab_size=759,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        # The tiny model's special tokens, with its tokenizer.
        **{k: tiny_config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")},
    )
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():  # a router that prefers different experts for different tokens
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / name, out / name)
    (out / "README.md").write_text(
        "# tiny-moe\n\nA random two-layer Qwen3-MoE (4 experts, top-2) on the tiny "
        "tokenizer, for the expert-parallel tests. Made by `scripts/make_tiny_moe.py`.\n"
    )
    print(f"wrote {out}: {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main()
