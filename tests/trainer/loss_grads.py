"""What the packing and objective tests compare: a trainer's micro-batch losses over a
batch, summed, and the gradients they leave, before any optimizer step."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch


def summed_loss_and_grads(
    trainer: Any, trajs: list, old: Any = None, token_adv: Any = None
) -> tuple[float, dict[str, torch.Tensor], set[type], list[list[int]]]:
    """(summed loss, gradients by parameter name, micro-batch types, the plan)."""
    totals = (float(sum(t.num_policy_tokens for t in trajs)), float(len(trajs)))
    acc, loss, kinds = defaultdict(float), 0.0, set()
    plan = trainer._plan(trajs)
    for rows in plan:
        mb = trainer._collate(trajs, rows)
        kinds.add(type(mb))
        logits = trainer._forward_logits(trainer.model, mb)
        part = trainer._loss(mb, logits, trajs, rows, old, None, totals, acc, token_adv)
        part.backward()
        loss += float(part.detach())
    return loss, {n: p.grad.clone() for n, p in trainer.model.named_parameters()}, kinds, plan
