"""Sequence packing against today's micro-batching, on long-tailed multi-turn episodes.

A GRPO batch of tool-use-like episodes: ``--groups`` prompts (50 to 300 tokens)
with ``--group-size`` episodes each, whose lengths follow a Pareto tail between
50 and 1,500 tokens; each episode alternates sampled turns (loss mask 1) and
tool observations (loss mask 0). The model is a random Llama built from a
config here (the shipped tiny model's context, 512, is too short for these
episodes): ``--hidden`` wide, 4 layers, context 4,096.

Both sides run `PolicyTrainer.train_step` (forward, backward and AdamW over the
whole batch) in one process, alternating, after one warm-up step each:

- ``unpacked``: today's micro-batches (length-sorted rows cut by dynamic
  programming, distinct prompts run once, prompt then responses on its KV
  cache), at the budget (``--budgets``) that ran fastest;
- ``packed``: ``trainer.packing = true`` at ``--packed-budget`` tokens per row.

Train tokens/s counts each episode's prompt and response tokens once (the same
count for both); ``useful`` is the share of the token slots a side computes
that are real tokens, not padding (packed rows have none; a prompt run again in
another micro-batch or row counts as real). ``kernels`` times
one forward + backward of the largest packed row with each attention kernel
that fits on CPU here: per-segment SDPA (what packing uses), and one SDPA call
with a dense block mask of the same row (``[1, 1, T, T]``), once each after a
warm-up. (flex_attention has no backward on CPU in torch 2.13.) Prints one JSON line.

    .venv/bin/python benchmarks/packing.py [--groups 8] [--group-size 8] [--reps 2]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from temper.config.schema import AlgoConfig, TrainerConfig
from temper.records import Trajectory
from temper.trainer.packing import PackedMicroBatch, collate_packed
from temper.trainer.policy_trainer import PolicyTrainer

VOCAB = 4096


def episodes(groups: int, group_size: int, seed: int) -> list[Trajectory]:
    """Tool-use-like groups: a shared prompt, then turns and observations, long-tailed."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randint(50, 300))]
        for _ in range(group_size):
            n = min(1500, int(50 * rng.paretovariate(1.0)))
            mask: list[int] = []
            while len(mask) < n:  # a turn of 20-120 sampled tokens, then an observation
                mask += [1] * rng.randint(20, 120) + [0] * rng.randint(10, 80)
            mask = mask[:n]
            out.append(
                Trajectory(
                    task_id=f"task{g}",
                    group_id=g,
                    prompt_ids=prompt,
                    response_ids=[rng.randrange(3, VOCAB) for _ in range(n)],
                    loss_mask=mask,
                    behaviour_logprobs=[-1.0 if m else 0.0 for m in mask],
                    versions=[0] * n,
                    finish_reason="stop",
                    advantage=rng.uniform(-1, 1),
                )
            )
    return out


def model(hidden: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=4,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).float()


def slots_unpacked(trajs: list[Trajectory], plan: list[list[int]]) -> tuple[int, int]:
    """(token slots, real tokens) today's micro-batches compute: distinct prompts x the
    longest prompt, then rows x the longest response less its last token."""
    slots = real = 0
    for rows in plan:
        prompts = {tuple(trajs[i].prompt_ids) for i in rows}
        fed = [max(len(trajs[i].response_ids) - 1, 0) for i in rows]
        slots += len(prompts) * max(map(len, prompts)) + len(rows) * max(fed)
        real += sum(map(len, prompts)) + sum(fed)
    return slots, real


def slots_packed(trajs: list[Trajectory], plan: list[list[int]]) -> tuple[int, int]:
    """A packed row computes exactly its tokens: prompts once per row, responses less one."""
    total = 0
    for rows in plan:
        total += sum(len(p) for p in {tuple(trajs[i].prompt_ids) for i in rows})
        total += sum(max(len(trajs[i].response_ids) - 1, 0) for i in rows)
    return total, total


def time_steps(trainer: PolicyTrainer, trajs: list[Trajectory], reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        for t in trajs:
            t.trainer_logprobs = None
        start = time.perf_counter()
        trainer.train_step(trajs)
        times.append(time.perf_counter() - start)
    return times


def kernel_times(net: LlamaForCausalLM, mb: PackedMicroBatch, reps: int) -> dict[str, float]:
    """Forward + backward seconds of one packed row: per-segment SDPA vs a dense block mask."""
    from temper.trainer.packing import packed_logits

    t = mb.input_ids.shape[1]
    keys, cu_q, cu_k = mb.layout.key_index, mb.layout.cu_q.tolist(), mb.layout.cu_k.tolist()
    dense = torch.zeros(t, t, dtype=torch.bool)
    for s in range(len(cu_q) - 1):
        q0, q1 = cu_q[s], cu_q[s + 1]
        seen = keys[cu_k[s] : cu_k[s + 1]]
        lq, lk = q1 - q0, len(seen)
        allowed = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
        dense[q0:q1, seen] = allowed
    mask4d = dense[None, None]

    def segments() -> None:
        packed_logits(net, mb).sum().backward()

    def dense_sdpa() -> None:
        out = net(
            input_ids=mb.input_ids,
            position_ids=mb.position_ids,
            attention_mask=mask4d,
            use_cache=False,
            logits_to_keep=mb.keep,
        ).logits[0]
        out.index_select(0, mb.flat_index).float().sum().backward()

    result = {}
    for name, fn in (("segment_sdpa", segments), ("dense_mask_sdpa", dense_sdpa)):
        fn()  # warm-up
        runs = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - start)
        net.zero_grad(set_to_none=True)
        result[name] = round(statistics.median(runs), 3)
    result["row_tokens"] = t
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--budgets", default="4096,8192", help="unpacked budgets tried")
    ap.add_argument("--packed-budget", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    trajs = episodes(a.groups, a.group_size, a.seed)
    tokens = sum(t.num_tokens for t in trajs)
    algo = AlgoConfig()

    def trainer(**cfg) -> PolicyTrainer:
        conf = TrainerConfig(lr=1e-6, warmup_steps=0, device="cpu", precision="fp32", **cfg)
        return PolicyTrainer(model(a.hidden), conf, algo, 100, pad_id=0)

    runs: dict[str, dict] = {}
    sides = {f"unpacked_{b}": {"micro_batch_tokens": int(b)} for b in a.budgets.split(",")}
    sides["packed"] = {"micro_batch_tokens": a.packed_budget, "packing": True}
    trainers = {name: trainer(**cfg) for name, cfg in sides.items()}
    for name, tr in trainers.items():
        time_steps(tr, trajs, 1)  # warm-up
        runs[name] = {"times": []}
    for _ in range(a.reps):  # alternate, so load on the machine hits every side alike
        for name, tr in trainers.items():
            runs[name]["times"] += time_steps(tr, trajs, 1)
    for name, tr in trainers.items():
        plan = tr._plan(trajs)
        count = slots_packed if name == "packed" else slots_unpacked
        slots, real = count(trajs, plan)
        secs = statistics.median(runs[name]["times"])
        runs[name] = {
            "step_s": round(secs, 3),
            "tokens_per_s": round(tokens / secs, 1),
            "micro_batches": len(plan),
            "useful": round(real / slots, 4),
        }
    best = min((n for n in runs if n != "packed"), key=lambda n: runs[n]["step_s"])
    packed_tr = trainers["packed"]
    rows = packed_tr._plan(trajs)
    biggest = max(rows, key=lambda r: slots_packed(trajs, [r])[0])
    kernels = kernel_times(packed_tr.model, collate_packed(trajs, biggest, 0), 1)
    print(
        json.dumps(
            {
                "benchmark": "packing",
                "trajectories": len(trajs),
                "train_tokens": tokens,
                "response_lengths": [
                    min(len(t.response_ids) for t in trajs),
                    round(statistics.median(len(t.response_ids) for t in trajs)),
                    max(len(t.response_ids) for t in trajs),
                ],
                "hidden": a.hidden,
                "threads": torch.get_num_threads(),
                "best_unpacked": best,
                "sides": runs,
                "speedup": round(runs[best]["step_s"] / runs["packed"]["step_s"], 3),
                "packed_useful": runs["packed"]["useful"],
                "unpacked_useful": runs[best]["useful"],
                "kernels": kernels,
            }
        )
    )


if __name__ == "__main__":
    main()
