"""GPU checks for the engine work, for one lent CUDA GPU (no hub access needed).

    bash scripts/gpu_check.sh          # at most 8 minutes on one H200

Prints one JSON line per check, then a summary line. Each check is independent:
one that cannot run (no vLLM, no CUDA) prints why and the rest go on.

1. vLLM tokens/s on a Qwen2.5-0.5B-shaped model (random weights from a config in
   code, bf16): raw `LLMEngine` and through Temper's `VLLMEngine`.
2. Weight sync of that model into vLLM, colocated on the GPU (the trainer's CUDA
   tensors handed over in-process; anchor: TRL reports 0.18 s for 0.6B).
3. The trainer's step time on CUDA (bf16 autocast) on the same model.
4. A short GRPO run of the tiny model with vLLM on the GPU (`temper train`).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import temper  # noqa: F401  (hides mismatched torch extensions first)
from temper.models import load_tokenizer, resolve_model_path


def report(check: str, **values) -> None:
    print(json.dumps({"check": check, **values}), flush=True)


def qwen_05b(root: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = load_tokenizer(str(resolve_model_path("tiny")))
    cfg = Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=True, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
        torch_dtype="bfloat16",
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    out = root / "qwen2.5-0.5b-random"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def vllm_checks(path: Path) -> None:
    from temper.engine.base import SamplingParams
    from temper.engine.vllm_engine import VLLMEngine, _vllm_params
    from temper.weights import push_weights

    tok = load_tokenizer(str(path))
    engine = VLLMEngine(str(path), tok, dtype="bfloat16", device="cuda", gpu_memory_utilization=0.6)
    prompts = [[5 + (i * 7 + j) % 700 for j in range(64)] for i in range(256)]
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=256, ignore_eos=True, seed=i)
        for i in range(256)
    ]

    async def temper_round() -> float:
        t0 = time.perf_counter()
        res = await asyncio.gather(
            *(engine.generate(p, q) for p, q in zip(prompts, params, strict=True))
        )
        return sum(len(r.samples[0].token_ids) for r in res) / (time.perf_counter() - t0)

    def raw_round() -> float:
        from vllm.inputs import TokensPrompt

        llm, t0, n = engine._llm, time.perf_counter(), 0
        for i, p in enumerate(prompts):
            llm.add_request(
                f"raw{i}-{t0}", TokensPrompt(prompt_token_ids=p), _vllm_params(params[i], 0, 256, 0)
            )
        while llm.has_unfinished_requests():
            n += sum(len(o.outputs[0].token_ids) for o in llm.step() if o.finished)
        return n / (time.perf_counter() - t0)

    asyncio.run(temper_round())
    raw, temper_ = raw_round(), asyncio.run(temper_round())
    report(
        "vllm_tokens_per_s",
        model="qwen2.5-0.5b-shaped",
        raw=raw,
        temper=temper_,
        ratio=temper_ / raw,
    )

    from transformers import AutoModelForCausalLM

    trainer_model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16).cuda()
    state = {k: v.detach() for k, v in trainer_model.state_dict().items()}
    times = []
    for v in range(1, 4):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        push_weights(engine, state, v)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    report(
        "weight_sync_s",
        model="qwen2.5-0.5b-shaped",
        transport="in-process (colocated CUDA)",
        seconds=times,
        anchor_trl_0_6b_s=0.18,
    )
    asyncio.run(engine.close())
    del trainer_model


def trainer_check(path: Path) -> None:
    from temper.config.schema import AlgoConfig, TrainerConfig
    from temper.models import load_model
    from temper.records import Trajectory
    from temper.trainer.policy_trainer import PolicyTrainer

    model = load_model(str(path), dtype=torch.float32).cuda()
    trainer = PolicyTrainer(
        model, TrainerConfig(precision="auto", warmup_steps=0), AlgoConfig(), 10, 0
    )
    trajs = []
    for i in range(16):
        prompt, resp = [5 + i] * 128, [7 + i % 50] * 256
        t = Trajectory(f"t{i}", i // 4, prompt, resp, [1] * 256, [-1.0] * 256, [0] * 256, "length")
        t.advantage = 1.0 if i % 2 else -1.0
        trajs.append(t)
    trainer.train_step(trajs)  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    trainer.train_step(trajs)
    torch.cuda.synchronize()
    report(
        "trainer_step_s",
        model="qwen2.5-0.5b-shaped",
        rows=16,
        tokens_per_row=384,
        precision=trainer.precision,
        seconds=time.perf_counter() - t0,
    )


def grpo_check(root: Path) -> None:
    entry = "import sys; from temper.cli.main import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", entry, "train", "--engine.type=vllm", "--engine.device=cuda",
           "--trainer.device=cuda", "--orchestrator.steps=20", "--eval.every=0",
           f"--run.output_dir={root}", "--run.name=gpu-grpo", "--log.progress=false"]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = (
        (root / "gpu-grpo" / "metrics.jsonl").read_text().splitlines()
        if proc.returncode == 0
        else []
    )
    last = json.loads(lines[-1]) if lines else {}
    report("grpo_tiny_vllm_cuda", exit=proc.returncode, seconds=time.perf_counter() - t0,
           steps=len(lines), last_reward=last.get("reward_mean"), mismatch=last.get("train_infer_logprob_diff"),
           tail=proc.stderr[-400:] if proc.returncode else "")  # fmt: skip


def main() -> None:
    if not torch.cuda.is_available():
        report("cuda", ok=False, why=f"torch {torch.__version__} sees no CUDA device")
        raise SystemExit(2)
    report("cuda", ok=True, device=torch.cuda.get_device_name(0), torch=torch.__version__)
    root = Path(tempfile.mkdtemp(prefix="temper-gpu-"))
    path = qwen_05b(root)
    for name, check in (
        ("vllm", lambda: vllm_checks(path)),
        ("trainer", lambda: trainer_check(path)),
        ("grpo", lambda: grpo_check(root)),
    ):
        try:
            check()
        except Exception as exc:
            report(name, ok=False, error=f"{type(exc).__name__}: {exc}"[:500])


if __name__ == "__main__":
    main()
