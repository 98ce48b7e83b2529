"""Micro-batching by a token budget, and collation into padded tensors.

Sequences are sorted by length (longest first) and packed greedily so that
`len(micro_batch) * longest_in_it <= budget`: the padded token count of every
micro-batch stays under the budget. A single sequence longer than the budget
gets a micro-batch of its own. The plan is deterministic for a given input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from temper.rollout.trajectory import Trajectory


def plan_micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Indices into `lengths`, grouped into micro-batches under `token_budget`."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        longest_if_added = max(longest, lengths[i])
        if current and longest_if_added * (len(current) + 1) > token_budget:
            batches.append(current)
            current, longest_if_added = [], lengths[i]
        current.append(i)
        longest = longest_if_added
    if current:
        batches.append(current)
    return batches


@dataclass
class MicroBatch:
    """Right-padded tensors for one forward pass.

    `input_ids`/`attention_mask`: [B, T]. The per-token tensors (`loss_mask`,
    `advantages`, `behaviour_logprobs`) are [B, T-1], aligned with the logits
    at positions 0..T-2, which predict tokens 1..T-1.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    behaviour_logprobs: torch.Tensor
    indices: list[int]


def collate(trajs: list[Trajectory], indices: list[int], pad_id: int) -> MicroBatch:
    seqs = [trajs[i] for i in indices]
    width = max(t.num_tokens for t in seqs)
    n = len(seqs)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width - 1), dtype=torch.float32)
    advantages = torch.zeros((n, width - 1), dtype=torch.float32)
    behaviour = torch.zeros((n, width - 1), dtype=torch.float32)
    for row, t in enumerate(seqs):
        ids = t.prompt_ids + t.response_ids
        p, r = len(t.prompt_ids), len(t.response_ids)
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        # Response token j sits at position p + j and is predicted by logits at p + j - 1.
        span = slice(p - 1, p - 1 + r)
        loss_mask[row, span] = torch.tensor(t.loss_mask, dtype=torch.float32)
        advantages[row, span] = t.advantage
        behaviour[row, span] = torch.tensor(t.behaviour_logprobs, dtype=torch.float32)
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        targets=input_ids[:, 1:],
        loss_mask=loss_mask,
        advantages=advantages,
        behaviour_logprobs=behaviour,
        indices=list(indices),
    )
