"""The tests' one way to run `temper train` in process, quick and quiet.

`QUIET` turns off what a test of the training loop rarely needs: the evals at the
start, during and at the end, the progress display, and the final checkpoint. A test
that needs one back passes its override after (later overrides win).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from temper.cli.main import main

NO_EVAL = ("--eval.at_start=false", "--eval.at_end=false", "--eval.every=0")
QUIET = (*NO_EVAL, "--log.progress=false", "--checkpoint.at_end=false")
#: A short rank-2 LoRA run whose every step learns (tests/trainer/test_lora*.py).
LORA_RUN = (
    "--lora.rank=2",
    "--orchestrator.prompts_per_step=2",
    "--orchestrator.group_size=4",
    "--orchestrator.max_response_tokens=12",
    "--orchestrator.drop_zero_variance_groups=false",
    "--trainer.lr=5e-4",
    "--trainer.warmup_steps=0",
    "--run.seed=3",
)


def exit_code(out: Path, name: str, *overrides: str) -> int:
    """Run `temper train` quietly as ``out/name`` with ``overrides``; its exit code."""
    args = ["train", f"--run.output_dir={out}", f"--run.name={name}", *QUIET, *overrides]
    return main(args)


def train(out: Path, name: str, *overrides: str) -> Path:
    """Run `temper train` quietly as ``out/name``; check it succeeded; the run directory."""
    code = exit_code(out, name, *overrides)
    assert code == 0, f"temper train exited {code}"
    return Path(out) / name


def metrics(run: Path) -> list[dict[str, Any]]:
    """A run's metrics.jsonl, one dict per step."""
    return [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]
