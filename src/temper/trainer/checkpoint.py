"""Atomic checkpoints with everything needed for an exact resume.

A checkpoint is a directory `checkpoints/step_N/` holding:
- the policy as an HF model directory (`config.json`, `model.safetensors`,
  tokenizer files), so `model.path` can point at it directly;
- `trainer.pt`: optimizer and scheduler state;
- `state.json`: step, policy version and the sampler state;
- `rng.pt`: python, numpy and torch RNG states;
- `dcp/` (world_size > 1 only): the model and optimizer as each trainer rank
  holds them, written with `torch.distributed.checkpoint` (DCP). `trainer.pt`
  then holds ``{"format": "dcp", "scheduler": ...}`` instead of the optimizer.
  DCP reshards on load, so such a checkpoint resumes on any world size,
  including 1 (`PolicyTrainer.load_checkpoint`); a world-size-1 checkpoint resumes on N
  ranks through the full optimizer state (`temper.trainer.distributed`).

It is written to a temporary sibling (`.step_N.<random>`) and renamed into
place, so a crash never leaves a half-written `step_N`; the next run in the
directory removes such a leftover (`remove_partial_checkpoints`). Older
checkpoints beyond `keep` are removed, except the best held-out step that
`checkpoints/best.json` names and the `checkpoints/best` link points to (`mark_best`). `Cadence` decides when the loop
writes one: every N steps, and every M minutes of training (on by default, so a
killed run can resume). A write that fails because the disk is full raises an
OSError with errno ENOSPC, whatever library did the writing (torch's own message
for it is "basic_ios::clear: iostream error").
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

STATE_FILE = "state.json"
DCP_DIR = "dcp"
#: Names the best held-out step's checkpoint, which pruning keeps.
BEST_FILE = "best.json"
#: A link to the best step's folder (`mark_best`).
BEST_LINK = "best"


class Cadence:
    """When the loop checkpoints after a step: every ``every`` steps (0: never by
    steps) and once ``every_minutes`` have passed since the last checkpoint (0: never
    by time). The clock starts at construction and on `restart`."""

    def __init__(
        self, every: int, every_minutes: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every = every
        self.period_s = every_minutes * 60.0
        self.clock = clock
        self.last = clock()

    def due(self, step: int) -> bool:
        by_steps = bool(self.every) and step % self.every == 0
        return by_steps or (self.period_s > 0 and self.clock() - self.last >= self.period_s)

    def restart(self) -> None:
        """Count from now: training starts, or a checkpoint was written (by the cadence,
        Ctrl-C, a health stop or keep_best)."""
        self.last = self.clock()


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
    write_extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write `ckpt_root/step_{step}` atomically and prune old checkpoints.

    ``write_extra(tmp_dir)`` adds files before the rename (the sharded trainer's
    DCP state), so they are part of the same atomic checkpoint.
    """
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / f"step_{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step_{step}.", dir=ckpt_root))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        torch.save(trainer_state, tmp / "trainer.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        if write_extra is not None:
            write_extra(tmp)
        (tmp / STATE_FILE).write_text(json.dumps({"step": step, **state}, indent=1))
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException as err:
        full = isinstance(err, Exception) and not _is_enospc(err) and _nearly_full(tmp, model)
        shutil.rmtree(tmp, ignore_errors=True)
        if full:  # torch and safetensors report a full disk in words of their own
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(final)) from err
        raise
    prune_checkpoints(ckpt_root, keep)
    return final


def prune_checkpoints(ckpt_root: Path, keep: int) -> None:
    """Remove all but the newest ``keep`` checkpoints and the best one (`mark_best`)."""
    best = best_checkpoint(ckpt_root)
    spared = None if best is None else f"step_{best['step']}"
    for old in list_checkpoints(ckpt_root)[:-keep]:
        if old.name != spared:
            shutil.rmtree(old, ignore_errors=True)


def best_checkpoint(ckpt_root: Path) -> dict[str, Any] | None:
    """``{"step": N, "accuracy": a}`` of the best held-out step marked so far, or None."""
    try:
        best = json.loads((ckpt_root / BEST_FILE).read_text())
    except (OSError, ValueError):
        return None  # none marked yet (or a mark cut short: the next best rewrites it)
    return best if isinstance(best, dict) and isinstance(best.get("step"), int) else None


def mark_best(ckpt_root: Path, step: int, accuracy: float, keep: int) -> None:
    """Name ``step_{step}`` the best held-out checkpoint (atomically); the one it
    replaces is pruned unless it is among the newest ``keep``."""
    tmp = ckpt_root / f".{BEST_FILE}.tmp"
    tmp.write_text(json.dumps({"step": step, "accuracy": accuracy}))
    os.replace(tmp, ckpt_root / BEST_FILE)
    # `checkpoints/best`, a relative link to the step's folder, so that the best model
    # loads by path (`--model.path runs/NAME/checkpoints/best`) and moves with the run.
    link = ckpt_root / f".{BEST_LINK}.tmp"
    link.unlink(missing_ok=True)
    link.symlink_to(f"step_{step}", target_is_directory=True)
    os.replace(link, ckpt_root / BEST_LINK)
    prune_checkpoints(ckpt_root, keep)


def _is_enospc(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno == errno.ENOSPC


def _nearly_full(path: Path, model: Any) -> bool:
    """Whether the filesystem of ``path`` is too full for the write that just failed.

    A write fails on a full disk with less free space left than the piece it
    was writing; the largest piece is one parameter tensor (or its optimizer
    state), so less than that plus 16 MiB free means the disk was full.
    """
    try:
        st = os.statvfs(path)
        largest = max((p.numel() * p.element_size() for p in model.parameters()), default=0)
    except (OSError, AttributeError, TypeError):
        return False
    return st.f_bavail * st.f_frsize < largest + (16 << 20)


def remove_partial_checkpoints(ckpt_root: Path) -> list[Path]:
    """Delete the hidden `.step_N.*` folders of checkpoint writes that never finished.

    A run killed (SIGKILL, power loss) while writing a checkpoint leaves one;
    nothing else reads them. Call only while no other process writes to
    ``ckpt_root``. Returns what was removed.
    """
    if not ckpt_root.is_dir():
        return []
    partial = [p for p in ckpt_root.glob(".step_*") if p.is_dir()]
    for p in partial:
        shutil.rmtree(p, ignore_errors=True)
    return partial


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


def dcp_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, adapter_only: bool = False
) -> tuple[Any, dict[str, Any]]:
    """What a DCP checkpoint holds, as ``(options, {"model": ..., "optim": ...})`` for
    `set_state_dict`: everything, or with ``[lora]`` (``adapter_only``) the trainable
    adapters and their optimizer state alone. The frozen base is the model's own
    files, so loading leaves it as it is; a tied output layer, which DCP's
    ``ignore_frozen_params`` keeps under its second name, is dropped too."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    if not adapter_only:
        options = StateDictOptions()
        model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
        return options, {"model": model_sd, "optim": optim_sd}
    options = StateDictOptions(ignore_frozen_params=True, strict=False)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    model_sd = {k: v for k, v in model_sd.items() if k in trainable}
    return options, {"model": model_sd, "optim": optim_sd}


def load_dcp_unsharded(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path, adapter_only: bool = False
) -> None:
    """Load a DCP model + optimizer checkpoint, written by any number of ranks, in one process.

    Needs no process group: DCP assembles each tensor from the shards on disk.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    options, state = dcp_state(model, optimizer, adapter_only)
    with warnings.catch_warnings():  # DCP warns that it assumes one process: we mean it
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=options,
    )
