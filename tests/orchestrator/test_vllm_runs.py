"""`temper train --engine.type=vllm`: sync, async and in a rollout worker (.venv-vllm).

Every step's update reaches vLLM (the version moves and the trainer's logprobs of
what vLLM sampled equal vLLM's own), whichever way the engine is placed, and with
``[lora]`` as vLLM LoRA adapters.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from temper.cli.main import main

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

COMMON = [
    "--engine.type=vllm",
    "--orchestrator.steps=3",
    "--orchestrator.prompts_per_step=4",
    "--orchestrator.group_size=4",
    "--orchestrator.drop_zero_variance_groups=false",
    "--eval.at_start=false",
    "--eval.at_end=false",
    "--eval.every=0",
    "--log.progress=false",
    "--trainer.lr=1e-3",
]


def _metrics(root: Path, name: str, *extra: str) -> list[dict]:
    argv = ["train", f"--run.output_dir={root}", f"--run.name={name}", *COMMON, *extra]
    assert main(argv) == 0
    return [json.loads(x) for x in (root / name / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "extra",
    [
        (),
        ("--orchestrator.max_staleness=1",),
        ("--orchestrator.backend=process", "--orchestrator.rollout_workers=1"),
        # [lora]: each update is an adapter, which vLLM serves as a LoRA of its own.
        ("--lora.rank=4",),
        ("--lora.rank=4", "--orchestrator.max_staleness=1"),
    ],
    ids=["sync", "async", "process-worker", "lora-sync", "lora-async"],
)
def test_training_on_vllm_publishes_every_update(tmp_path, extra):
    metrics = _metrics(tmp_path, "run", *extra)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [m["policy_version"] for m in metrics] == [1, 2, 3]
    asynchronous = "--orchestrator.max_staleness=1" in extra
    for m in metrics:
        assert m["train_tokens"] > 0 and m["grad_norm"] > 0, m
        assert m["staleness_max"] <= (1 if asynchronous else 0), m
        if not asynchronous:
            # vLLM sampled with the weights the trainer had: same logprobs, up to fp32 noise.
            assert m["train_infer_logprob_diff"] < 1e-4, m
