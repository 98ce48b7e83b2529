"""LoRA against full fine-tuning on a ~100M-parameter random model of the built-in
architecture: trainer memory, weight-update bytes and seconds, engine tokens/s.

The model is the built-in tiny model's Llama config (its vocabulary, RoPE, tied
embeddings) scaled to ``--hidden`` 768, ``--intermediate`` 3072 and ``--layers`` 10
(about 95M parameters), randomly initialised in memory. In one run, for full
fine-tuning and for LoRA at ``--rank`` (default 8, alpha 32, every linear layer of
attention and MLP), it measures:

- **trainer memory**: the bytes of weights + gradients + AdamW state after one
  `PolicyTrainer.train_step` on synthetic trajectories, counted from the tensors
  themselves (so other processes on the machine do not enter);
- **a weight update**: bytes of what the trainer publishes (the whole state dict,
  or the adapter: `temper.weights.adapter`), and seconds from ``engine_state_dict``
  through a shared-memory ring (the transport rollout workers read) to the native
  engine holding it (for LoRA that includes merging ``W0 + B A`` into every layer);
  median of ``--reps``. Also the bytes a merged delta (``B A`` per layer) would be;
- **engine tokens/s** of the native engine decoding ``--rows`` sequences x
  ``--tokens`` tokens, best of ``--reps``: after an adapter update (merged into its
  weights, as the engine does it) against a LoRA-aware forward that keeps the
  adapter apart and adds ``(x A^T) B^T`` to every adapted projection (a prototype
  patched in here, its logprobs checked against the merged engine's), the
  alternative the engine's design was chosen against.

Prints one JSON line with the ratios (``update_bytes_ratio``: LoRA update bytes /
full update bytes; goals: memory <= 0.4, bytes <= 0.02, applied >= 0.9 merged).

    .venv/bin/python benchmarks/lora.py [--rank 8] [--reps 3]

``--learning`` runs the other half instead: LoRA at ranks 1, 8 and 32 against full
fine-tuning on the demo task, 3 seeds each (`lora_learning.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from temper.builder.trainer import build_lora
from temper.config.lora import LoraConfig
from temper.config.schema import AlgoConfig, TrainerConfig
from temper.engine import llama_forward
from temper.engine.base import SamplingParams
from temper.engine.native import NativeEngine
from temper.models.loader import TINY_DIR
from temper.records import Trajectory
from temper.trainer.policy_trainer import PolicyTrainer
from temper.weights.adapter import LORA_A, LORA_B, adapter_pairs
from temper.weights.shm_ring import SharedMemoryRingTransport


def random_model(args: argparse.Namespace, seed: int = 0) -> LlamaForCausalLM:
    cfg = LlamaConfig.from_pretrained(TINY_DIR)
    cfg.hidden_size, cfg.intermediate_size = args.hidden, args.intermediate
    cfg.num_hidden_layers, cfg.num_attention_heads = args.layers, args.hidden // 64
    cfg.num_key_value_heads, cfg.head_dim = args.hidden // 64, 64
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def trajectories(n: int = 8, seed: int = 0) -> list[Trajectory]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        resp = torch.randint(3, 700, (24,), generator=g).tolist()
        out.append(
            Trajectory(
                task_id=f"t{i // 4}",
                group_id=i // 4,
                prompt_ids=[1, 87, 85, 20 + i % 4] * 4,
                response_ids=resp,
                loss_mask=[1] * len(resp),
                behaviour_logprobs=[-6.0] * len(resp),
                versions=[0] * len(resp),
                finish_reason="stop",
                advantage=1.0 if i % 2 else -1.0,
            )
        )
    return out


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def trainer_memory(trainer: PolicyTrainer) -> dict[str, int]:
    params = list(trainer.model.parameters())
    states = [v for s in trainer.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return {
        "weights": nbytes(params),
        "grads": nbytes(p.grad for p in params if p.grad is not None),
        "optimizer": nbytes(s for s in states if s.dim() > 0),  # not Adam's step counters
    }


def timed_updates(trainer: PolicyTrainer, engine: NativeEngine, reps: int) -> list[float]:
    """Seconds per weight update: publish into a fresh ring, the engine loads it."""
    times = []
    with tempfile.TemporaryDirectory(dir="/dev/shm") as root:
        ring = SharedMemoryRingTransport(Path(root) / "ring")
        for version in range(1, reps + 2):
            t0 = time.perf_counter()
            ring.publish(trainer.engine_state_dict(), version)
            engine.load_weights(ring, version)
            times.append(time.perf_counter() - t0)
    return times[1:]  # the first publish sizes and maps the ring's slots


async def _decode(engine: NativeEngine, rows: int, tokens: int) -> float:
    """Tokens/s of 4 prompts x ``rows`` samples x ``tokens`` tokens."""
    params = SamplingParams(n=rows, max_new_tokens=tokens, seed=1, ignore_eos=True)
    prompts = [[5 + i, 6, 7, 8, 9, 10, 11, 12] for i in range(4)]
    t0 = time.perf_counter()
    await asyncio.gather(*[engine.generate(p, params) for p in prompts])
    return 4 * rows * tokens / (time.perf_counter() - t0)


def _greedy(engine: NativeEngine) -> tuple[list[int], list[float]]:
    params = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True)
    sample = asyncio.run(engine.generate([5, 6, 7, 8, 9, 10, 11, 12], params)).samples[0]
    return sample.token_ids, sample.logprobs


def _gap(a: tuple[list[int], list[float]], b: tuple[list[int], list[float]]) -> float:
    """Largest logprob difference over the tokens two greedy samples share from the start."""
    same = next((i for i, (x, y) in enumerate(zip(a[0], b[0], strict=True)) if x != y), 16)
    return max((abs(x - y) for x, y in zip(a[1][:same], b[1][:same], strict=True)), default=0.0)


class AppliedAdapter:
    """The LoRA-aware forward, patched in: the engine's fused projections (q/k/v, o,
    gate/up, down) each add ``(x @ A^T) @ B^T`` of their adapters, with A of a fused
    projection stacked and B block-diagonal, so one projection costs two small GEMMs
    more; the engine's weights stay the base."""

    def __init__(self, engine: NativeEngine, update: dict[str, torch.Tensor]) -> None:
        weights = engine._model.weights
        pairs = adapter_pairs(update)
        self.extra: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        fused = {
            "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "o": ("self_attn.o_proj",),
            "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
            "down": ("mlp.down_proj",),
        }
        for i, layer in enumerate(weights.layers):
            for key, parts in fused.items():
                names = [f"model.layers.{i}.{part}.weight" for part in parts]
                a = torch.cat([pairs[n][0] for n in names]).t().contiguous()
                # B's rows in the engine's order (q and k heads in rotary pairs).
                bs = [weights._pairs_from_hf(n, pairs[n][1]) for n in names]
                self.extra[layer[key].data_ptr()] = (a, torch.block_diag(*bs).t().contiguous())
        self.plain = llama_forward._linear

    def linear(self, x, wt, bias, residual=None):
        y = self.plain(x, wt, bias, residual)
        extra = self.extra.get(wt.data_ptr())
        if extra is not None:
            a, b = extra
            y.view(-1, y.shape[-1]).addmm_(x.reshape(-1, x.shape[-1]) @ a, b)
        return y


def engine_speed(engine: NativeEngine, update, args) -> dict[str, float]:
    """Tokens/s merged (the engine's own way) against applied (`AppliedAdapter`)."""
    engine.load_weights(_one_shot(update), 1)  # merged into the engine's weights
    merged = {name: engine._model.read(name) for name in adapter_pairs(update)}
    base = engine._adapters._base  # W0, what the merge started from
    applied = AppliedAdapter(engine, update)
    asyncio.run(_decode(engine, 2, 4))  # warm-up
    speeds: dict[str, list[float]] = {"merged": [], "applied": []}
    greedy = {"merged": _greedy(engine)}
    for rep in range(args.reps):
        for mode in ("merged", "applied"):
            if mode == "applied":  # the base weights, the adapter beside them
                engine._model.load_state_dict(base)
                llama_forward._linear = applied.linear
            try:
                speeds[mode].append(asyncio.run(_decode(engine, args.rows, args.tokens)))
                if mode == "applied" and rep == 0:
                    greedy["applied"] = _greedy(engine)
                    llama_forward._linear = applied.plain
                    greedy["base"] = _greedy(engine)
            finally:
                llama_forward._linear = applied.plain
                engine._model.load_state_dict(merged)
    return {
        "merged_tokens_per_s": max(speeds["merged"]),
        "applied_tokens_per_s": max(speeds["applied"]),
        # The prototype computes what the merged engine does (float rounding apart),
        # and the adapter moves the policy far more than that.
        "applied_vs_merged_logprob_max_diff": _gap(greedy["merged"], greedy["applied"]),
        "adapter_vs_base_logprob_max_diff": _gap(greedy["merged"], greedy["base"]),
    }


def _one_shot(update):
    from temper.weights.transport import InProcessTransport

    transport = InProcessTransport(copy=False, verify=False)
    transport.publish(update, 1)
    return transport


def measure(args: argparse.Namespace, rank: int | None) -> dict:
    model = random_model(args)
    engine = NativeEngine(random_model(args), max_slots=64, prefix_cache_mb=0)
    torch.manual_seed(1)
    adapter = None if rank is None else build_lora(LoraConfig(rank=rank), model)
    lr = 1e-4 if rank is None else 1e-3  # LoRA at 10x (lora.lr_multiplier's default)
    trainer = PolicyTrainer(
        model, TrainerConfig(lr=lr, warmup_steps=0), AlgoConfig(), 10, 0, adapter=adapter
    )
    t0 = time.perf_counter()
    trainer.train_step(trajectories())
    step_s = time.perf_counter() - t0
    memory = trainer_memory(trainer)
    update = trainer.engine_state_dict()
    out = {
        "params": sum(p.numel() for p in model.parameters()),
        "trainer_bytes": sum(memory.values()),
        **{f"trainer_{k}_bytes": v for k, v in memory.items()},
        "train_step_s": step_s,
        "update_bytes": nbytes(update.values()),
        "update_s": statistics.median(timed_updates(trainer, engine, args.reps)),
    }
    if rank is not None:
        pairs = adapter_pairs(update)
        # B A per layer: as many float32 values as the weights it changes.
        out["merged_delta_bytes"] = sum(b.shape[0] * a.shape[1] * 4 for a, b in pairs.values())
        out["engine_kept_base_bytes"] = nbytes(engine._adapters._base.values())
        out.update(engine_speed(engine, update, args))
        assert all(k.endswith((LORA_A, LORA_B)) for k in update)
    asyncio.run(engine.close())
    return out


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
    full = measure(args, None)
    lora = measure(args, args.rank)
    out = {
        "benchmark": "lora",
        "rank": args.rank,
        "params": full["params"],
        "full": full,
        "lora": lora,
        "trainer_memory_ratio": lora["trainer_bytes"] / full["trainer_bytes"],
        "update_bytes_ratio": lora["update_bytes"] / full["update_bytes"],
        "update_seconds_ratio": lora["update_s"] / full["update_s"],
        "merged_delta_bytes_ratio": lora["merged_delta_bytes"] / full["update_bytes"],
        "applied_vs_merged_tokens_per_s": lora["applied_tokens_per_s"]
        / lora["merged_tokens_per_s"],
    }
    out["goal_memory_le_0.4"] = out["trainer_memory_ratio"] <= 0.4
    out["goal_bytes_le_0.02"] = out["update_bytes_ratio"] <= 0.02
    print(json.dumps(out))


if __name__ == "__main__":
    if "--learning" in sys.argv[1:]:  # the learning comparison: lora_learning.py
        from lora_learning import learning

        learning([a for a in sys.argv[1:] if a != "--learning"])
    else:
        main()
