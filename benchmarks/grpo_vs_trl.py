"""Temper vs TRL GRPOTrainer: seconds per GRPO step and peak memory, side by side.

Same model (the built-in tiny model), same prompts (built-in arithmetic), same
reward function (below, TRL's signature), same hyperparameters: 8 prompts x 8
samples, up to 32 new tokens, temperature 1.0, lr 1e-5, clip 0.2/0.2, no KL,
token-mean ("dapo") loss, std-scaled group advantages, one optimizer step per
generation batch with forward/backward in micro-batches of the same padded size
(TRL: per-device batch 16 with 4 accumulation steps, i.e. 16 x (longest prompt
+ 32) padded tokens per forward; Temper: that many tokens as its
`micro_batch_tokens` budget, within which its trainer runs each distinct prompt
once plus its responses, cutting length-sorted rows to the least padding), fp32, 2 CPU threads. Each side runs in its own subprocess so
peak RSS is its own. Prints one JSON line; `ratio` = TRL median s/step divided
by Temper median s/step (higher is better for Temper).

Needs the `bench` extra: pip install -e ".[bench]".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS, GROUP, MAX_NEW, LR, THREADS = 8, 8, 32, 1e-5, 2
#: Sequences per forward/backward on both sides (gradient accumulation over the rest).
MICRO = 16
BOXED = re.compile(r"\\boxed\{([^}]*)\}")


def boxed_reward(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 when the last \\boxed{} equals the answer; TRL's reward signature."""
    out = []
    for completion, gold in zip(completions, answer, strict=True):
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        found = BOXED.findall(text)
        out.append(1.0 if found and found[-1].strip() == str(gold) else 0.0)
    return out


def write_dataset(path: Path, n: int) -> None:
    import random

    from temper.data.arithmetic import ArithmeticTasks

    tasks = ArithmeticTasks(levels=(1, 2, 3), seed=0).sample(random.Random(0), n)
    with open(path, "w") as f:
        for t in tasks:
            f.write(json.dumps({"prompt": t.prompt, "answer": t.answer}) + "\n")


def longest_prompt_tokens(data: Path, model: str) -> int:
    """Tokens of the longest chat-templated prompt in ``data`` (TRL pads to it)."""
    from temper.models import load_tokenizer

    tok = load_tokenizer(model)
    longest = 0
    for line in data.read_text().splitlines():
        messages = [{"role": "user", "content": json.loads(line)["prompt"]}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        longest = max(longest, len(tok(text, add_special_tokens=False)["input_ids"]))
    return longest


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_temper(data: Path, steps: int, out_dir: Path, model: str) -> dict:
    import asyncio

    from temper.config import config_from_dict
    from temper.orchestrator.loop import Orchestrator

    cfg = config_from_dict(
        {
            "run": {
                "name": "bench",
                "output_dir": str(out_dir),
                "overwrite": True,
                "threads": THREADS,
            },
            "model": {"path": model},
            "data": {"type": "file", "path": str(data), "eval_path": str(data)},
            "reward": {
                "components": [
                    {"type": "python", "function": f"{Path(__file__).resolve()}:boxed_reward"}
                ]
            },
            "algo": {
                "advantage": "grpo",
                "loss_agg": "token-mean",
                "clip_low": 0.2,
                "clip_high": 0.2,
                "kl_coef": 0.0,
            },
            "trainer": {
                "lr": LR,
                "warmup_steps": 0,
                "micro_batch_tokens": MICRO * (longest_prompt_tokens(data, model) + MAX_NEW),
            },
            "orchestrator": {
                "steps": steps,
                "prompts_per_step": PROMPTS,
                "group_size": GROUP,
                "max_response_tokens": MAX_NEW,
                "drop_zero_variance_groups": False,
            },
            "eval": {"at_start": False, "at_end": False, "every": 0},
            "checkpoint": {"at_end": False},
            "log": {"progress": False, "trajectories_per_step": 0},
        }
    )

    async def go() -> None:
        orch = Orchestrator(cfg)
        try:
            await orch.run()
        finally:
            await orch.close()

    asyncio.run(go())
    rows = [json.loads(x) for x in (out_dir / "bench" / "metrics.jsonl").read_text().splitlines()]
    return {
        "step_s": [r["time_step_s"] for r in rows],
        "tokens_per_step": statistics.mean(r["tokens_generated"] for r in rows),
    }


def run_trl(data: Path, steps: int, out_dir: Path, model: str) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from temper.models import resolve_model_path

    path = str(resolve_model_path(model))
    rows = [json.loads(x) for x in data.read_text().splitlines()]
    ds = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
            for r in rows
        ]
    )
    times: list[float] = []
    tokens: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                tokens.append(logs["completions/mean_length"] * PROMPTS * GROUP)

    args = GRPOConfig(
        output_dir=str(out_dir / "trl"),
        use_cpu=True,
        bf16=False,
        report_to=[],
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=PROMPTS * GROUP // MICRO,
        num_generations=GROUP,
        steps_per_generation=PROMPTS * GROUP // MICRO,
        max_completion_length=MAX_NEW,
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.2,
        loss_type="dapo",
        scale_rewards="group",
        num_iterations=1,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        use_vllm=False,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        reward_funcs=boxed_reward,
        args=args,
        train_dataset=ds,
        processing_class=AutoTokenizer.from_pretrained(path),
        callbacks=[Timer()],
    )
    trainer.train()
    return {"step_s": times, "tokens_per_step": statistics.mean(tokens) if tokens else None}


def child(side: str, data: Path, steps: int, model: str) -> None:
    import torch

    torch.set_num_threads(THREADS)
    with tempfile.TemporaryDirectory() as tmp:
        fn = run_temper if side == "temper" else run_trl
        result = fn(data, steps, Path(tmp), model)
    result["peak_rss_mb"] = peak_rss_mb()
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--side", choices=["temper", "trl"])
    p.add_argument("--data")
    p.add_argument("--model", default="tiny", help='model directory or "tiny"')
    a = p.parse_args()
    if a.side:
        child(a.side, Path(a.data), a.steps, a.model)
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "prompts.jsonl"
        write_dataset(data, PROMPTS * a.steps * 2)
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(THREADS)}
        for side in ("temper", "trl"):
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--side",
                    side,
                    "--data",
                    str(data),
                    "--steps",
                    str(a.steps),
                    "--model",
                    a.model,
                ],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"{side} run failed:\n{proc.stderr[-3000:]}")
            results[side] = json.loads(line[len("RESULT ") :])
    # The first step of each side includes warm-up (allocations, lazy imports).
    med = {s: statistics.median(r["step_s"][1:] or r["step_s"]) for s, r in results.items()}
    print(
        json.dumps(
            {
                "benchmark": "grpo_vs_trl",
                "prompts": PROMPTS,
                "group_size": GROUP,
                "max_new_tokens": MAX_NEW,
                "temper_median_step_s": round(med["temper"], 4),
                "trl_median_step_s": round(med["trl"], 4),
                "ratio": round(med["trl"] / med["temper"], 3),
                "temper_peak_rss_mb": round(results["temper"]["peak_rss_mb"], 1),
                "trl_peak_rss_mb": round(results["trl"]["peak_rss_mb"], 1),
                "rss_ok": results["temper"]["peak_rss_mb"] <= results["trl"]["peak_rss_mb"],
                "temper_tokens_per_step": results["temper"]["tokens_per_step"],
                "trl_tokens_per_step": results["trl"]["tokens_per_step"],
            }
        )
    )


if __name__ == "__main__":
    main()
