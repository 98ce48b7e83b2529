"""Micro-batching by a token budget, with each distinct prompt run once.

A GRPO step trains on groups: n responses to the same prompt. Running every
(prompt + response) row through the model repeats the prompt's forward and
backward n times. Here a micro-batch holds its *distinct* prompts once and its
responses separately; `temper.trainer.forward.response_logits` runs the
prompts, hands their keys/values to the responses, and backpropagates through
both. The result equals the row-by-row forward up to float rounding (tested),
and the prompt's share of compute and activation memory drops n-fold.

Rows are ordered by prompt (groups in order of first appearance, longest
response first inside a group) and packed greedily while the padded cost
``prompts * longest prompt + rows * longest response`` stays within the budget.
A row whose own cost exceeds the budget gets a micro-batch to itself. The plan
is deterministic for a given input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from temper.rollout.trajectory import Trajectory


def plan_micro_batches(trajs: list[Trajectory], token_budget: int) -> list[list[int]]:
    """Row indices of ``trajs``, grouped into micro-batches under ``token_budget`` padded tokens."""
    keys = [tuple(t.prompt_ids) for t in trajs]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    order: list[int] = []
    for group in groups.values():  # groups in order of first appearance
        order += sorted(group, key=lambda i: (-len(trajs[i].response_ids), i))
    batches: list[list[int]] = []
    current: list[int] = []
    prompts: set[tuple[int, ...]] = set()
    longest_p = longest_r = 0
    for i in order:
        t = trajs[i]
        new_prompts = len(prompts) + (keys[i] not in prompts)
        p = max(longest_p, len(t.prompt_ids))
        r = max(longest_r, len(t.response_ids))
        if current and new_prompts * p + (len(current) + 1) * r > token_budget:
            batches.append(current)
            current, prompts = [], set()
            p, r = len(t.prompt_ids), len(t.response_ids)
        current.append(i)
        prompts.add(keys[i])
        longest_p, longest_r = p, r
    if current:
        batches.append(current)
    return batches


@dataclass
class MicroBatch:
    """Tensors for one forward: distinct prompts once, responses per row.

    ``prompt_ids``/``prompt_mask`` are ``[Np, P]`` (right-padded), with
    ``prompt_lengths [Np]``; row b continues prompt ``prompt_index[b]``.
    ``response_ids``/``response_mask`` are ``[B, R]`` (right-padded). The
    per-token tensors (``loss_mask``, ``advantages``, ``behaviour_logprobs``)
    are ``[B, R]``: position j belongs to response token j.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    prompt_lengths: torch.Tensor
    prompt_index: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    behaviour_logprobs: torch.Tensor
    indices: list[int]

    @property
    def targets(self) -> torch.Tensor:
        return self.response_ids


def _right_padded(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[row, : len(s)] = 1
    return ids, mask


def collate(trajs: list[Trajectory], indices: list[int], pad_id: int) -> MicroBatch:
    """The `MicroBatch` of rows ``indices`` of ``trajs``."""
    seqs = [trajs[i] for i in indices]
    slot: dict[tuple[int, ...], int] = {}
    prompts: list[list[int]] = []
    prompt_index = []
    for t in seqs:
        key = tuple(t.prompt_ids)
        if key not in slot:
            slot[key] = len(prompts)
            prompts.append(t.prompt_ids)
        prompt_index.append(slot[key])
    prompt_ids, prompt_mask = _right_padded(prompts, pad_id)
    response_ids, response_mask = _right_padded([t.response_ids for t in seqs], pad_id)
    shape = response_ids.shape
    loss_mask = torch.zeros(shape, dtype=torch.float32)
    advantages = torch.zeros(shape, dtype=torch.float32)
    behaviour = torch.zeros(shape, dtype=torch.float32)
    for row, t in enumerate(seqs):
        r = len(t.response_ids)
        loss_mask[row, :r] = torch.tensor(t.loss_mask, dtype=torch.float32)
        advantages[row, :r] = t.advantage
        behaviour[row, :r] = torch.tensor(t.behaviour_logprobs, dtype=torch.float32)
    return MicroBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        prompt_lengths=prompt_mask.sum(1),
        prompt_index=torch.tensor(prompt_index, dtype=torch.long),
        response_ids=response_ids,
        response_mask=response_mask,
        loss_mask=loss_mask,
        advantages=advantages,
        behaviour_logprobs=behaviour,
        indices=list(indices),
    )
