"""What the distillation run tests share: their short-run flags and a teacher whose
tokenizer swaps the ids of "1" and "2" (the same vocabulary, other meanings)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from temper.models import resolve_model_path

SHORT = [
    "--algo.advantage=distill",
    "--trainer.warmup_steps=0",
    "--eval.size=8",
    "--eval.k=1",
    "--eval.every=0",
    "--log.progress=false",
    "--checkpoint.at_end=false",
    "--checkpoint.keep_best=false",
    "--orchestrator.prompts_per_step=4",
    "--orchestrator.group_size=2",
    "--orchestrator.max_response_tokens=16",
]


def swapped_digits_model(folder: Path) -> Path:
    """A copy of the tiny model at ``folder`` with the ids of "1" and "2" swapped."""
    shutil.copytree(resolve_model_path("tiny"), folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["1"], vocab["2"] = vocab["2"], vocab["1"]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder
