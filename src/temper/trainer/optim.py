"""AdamW with a warmup + decay learning-rate schedule."""

from __future__ import annotations

import math

import torch

from temper.config.trainer import TrainerConfig


def lr_multiplier(step: int, warmup: int, total: int, schedule: str) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based).

    Linear warmup over `warmup` steps, then constant, cosine to 0, or linear
    to 0 at `total` steps.
    """
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - progress


def build_optimizer(
    model: torch.nn.Module, cfg: TrainerConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, eps=1e-8
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_multiplier(s, cfg.warmup_steps, total_steps, cfg.schedule)
    )
    return opt, sched
