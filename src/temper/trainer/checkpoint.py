"""Atomic checkpoints with everything needed for an exact resume.

A checkpoint is a directory `checkpoints/step_N/` holding:
- the policy as an HF model directory (`config.json`, `model.safetensors`,
  tokenizer files), so `model.path` can point at it directly;
- `trainer.pt`: optimizer and scheduler state;
- `state.json`: step, policy version and the sampler state;
- `rng.pt`: python, numpy and torch RNG states.

It is written to a temporary sibling and renamed into place, so a crash never
leaves a half-written `step_N`. Older checkpoints beyond `keep` are removed.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

STATE_FILE = "state.json"


def _fsync_tree(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    ckpt_root: Path,
    step: int,
    model: Any,
    tokenizer: Any,
    trainer_state: dict[str, Any],
    state: dict[str, Any],
    keep: int,
) -> Path:
    """Write `ckpt_root/step_{step}` atomically and prune old checkpoints."""
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step_{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step_{step}.", dir=ckpt_root))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        torch.save(trainer_state, tmp / "trainer.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        (tmp / STATE_FILE).write_text(json.dumps({"step": step, **state}, indent=1))
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(ckpt_root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not ckpt_root.is_dir():
        return []
    found = [p for p in ckpt_root.glob("step_*") if p.is_dir() and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def load_checkpoint_state(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(state.json, trainer state, rng state) of one checkpoint directory."""
    state = json.loads((path / STATE_FILE).read_text())
    trainer_state = torch.load(path / "trainer.pt", weights_only=False)
    rng = torch.load(path / "rng.pt", weights_only=False)
    return state, trainer_state, rng
