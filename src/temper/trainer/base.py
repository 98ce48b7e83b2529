"""The `Trainer` protocol: what the loop may ask of a trainer, and what it declares it can do.

Two implementations: `PolicyTrainer` (one process) and `DistributedTrainer` (FSDP2 ranks
in other processes, spawned, launched or Ray actors). The loop, the checkpoints and the
self-improvement steps talk to either through this protocol alone; an ability a trainer
lacks is declared False in `TrainerAbilities`, and `TrainerDefaults` supplies the
methods it leaves out, so no caller probes a trainer for a method.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from temper.records import Trajectory

if TYPE_CHECKING:
    from temper.trainer.preference import ResponsePair


@dataclass(frozen=True)
class TrainerAbilities:
    """What a trainer can do beyond training and checkpointing.

    ``undo``: `snapshot` and `restore` (a health check with action "skip" undoes
    an update). ``sharded_state``: `write_sharded_state` writes the model and
    optimizer shards of every rank (DCP) beside the checkpoint's HF weights.
    ``adapter``: the trainer trains a LoRA adapter over frozen base weights
    (``[lora]``): `engine_state_dict` is the adapter (`temper.weights.adapter`), a
    checkpoint holds the adapter rather than an HF model, and a resumed run loads the
    base from ``model.path`` and hands the engines the adapter again.
    ``preference``: `train_pairs` and `sequence_logprobs` (DPO, ``trainer.mode = "dpo"``).
    """

    undo: bool = False
    sharded_state: bool = False
    adapter: bool = False
    preference: bool = False


@runtime_checkable
class Trainer(Protocol):
    """Updates the policy on scored trajectories and hands its weights to the engines."""

    abilities: TrainerAbilities
    #: The parent's copy of the policy: what checkpoints save the HF weights from.
    model: torch.nn.Module

    def train_step(self, trajs: list[Trajectory]) -> dict[str, float]:
        """One update (every epoch and mini-batch of it) on ``trajs``; averaged metrics.
        Sets each trajectory's ``trainer_logprobs``."""
        ...

    def train_pairs(self, pairs: list[ResponsePair]) -> dict[str, float]:
        """``abilities.preference``: one DPO update (every epoch and mini-batch) on
        ``pairs``, whose reference logprobs are set; averaged metrics."""
        ...

    def sequence_logprobs(self, trajs: list[Trajectory], reference: bool = False) -> list[float]:
        """``abilities.preference``: each trajectory's summed logprob of its loss-masked
        tokens under the policy now (``reference``: the frozen reference model), no grad."""
        ...

    def engine_state_dict(self) -> dict[str, torch.Tensor]:
        """The current weights, detached, for publishing to engines (with
        ``abilities.adapter``: the adapter only)."""
        ...

    def saved_model(self) -> Any:
        """What a checkpoint's ``save_pretrained`` writes: the policy as an HF model, or
        with ``abilities.adapter`` peft's model (the adapter files alone)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Optimizer and scheduler state for the checkpoint's ``trainer.pt``."""
        ...

    def load_checkpoint(self, ckpt: Path, trainer_state: dict[str, Any]) -> None:
        """Restore weights, optimizer and scheduler from checkpoint directory ``ckpt``
        (``trainer_state`` is its ``trainer.pt``), whatever world size wrote it."""
        ...

    def write_sharded_state(self, directory: Path) -> None:
        """``abilities.sharded_state``: every rank writes its shards under ``directory``."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """``abilities.undo``: a copy of weights and optimizer state, for `restore`."""
        ...

    def restore(self, snapshot: dict[str, Any]) -> None:
        """``abilities.undo``: undo everything since `snapshot`."""
        ...

    def close(self) -> None:
        """Stop what the trainer runs beside this process (ranks); idempotent."""
        ...


class TrainerDefaults:
    """The `Trainer` methods an implementation's abilities leave out."""

    model: torch.nn.Module

    def saved_model(self) -> Any:
        return self.model

    def write_sharded_state(self, directory: Path) -> None:
        raise NotImplementedError(f"{type(self).__name__} writes no sharded state")

    def train_pairs(self, pairs: list[ResponsePair]) -> dict[str, float]:
        raise NotImplementedError(f"{type(self).__name__} does not train on pairs (DPO)")

    def sequence_logprobs(self, trajs: list[Trajectory], reference: bool = False) -> list[float]:
        raise NotImplementedError(f"{type(self).__name__} does not score sequences")

    def snapshot(self) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} cannot undo an update")

    def restore(self, snapshot: dict[str, Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot undo an update")

    def close(self) -> None:
        return None
