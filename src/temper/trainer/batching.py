"""Micro-batching by a token budget, with each distinct prompt run once.

A GRPO step trains on groups: n responses to the same prompt. Running every
(prompt + response) row through the model repeats the prompt's forward and
backward n times. Here a micro-batch holds its *distinct* prompts once and its
responses separately; `temper.trainer.forward.response_logits` runs the
prompts, hands their keys/values to the responses, and backpropagates through
both. The result equals the row-by-row forward up to float rounding (tested),
and the prompt's share of compute and activation memory drops n-fold.

The planner sorts rows by response length (longest first; ties by prompt,
then response tokens, so the plan does not depend on the rows' order) and cuts that order into micro-batches by dynamic
programming, minimising the total padded cost ``distinct prompts * longest
prompt + rows * longest response`` plus a fixed ``overhead`` per micro-batch
(the cost of one more forward/backward call, in padded tokens), with every
micro-batch's padded cost within the token budget. A row whose own cost
exceeds the budget gets a micro-batch to itself. Rollouts with long-tailed
response lengths then pay for their padding once, in one micro-batch of long
rows, instead of in every row. The plan depends only on the rows' contents.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from temper.records import Trajectory

#: Image hashes in order -> the model's image inputs for them, concatenated
#: (e.g. ``{"pixel_values": [k, 3, H, W]}``); see `temper.vision.inputs`.
PixelSource = Callable[[Sequence[str]], dict[str, torch.Tensor]]


def plan_micro_batches(
    trajs: list[Trajectory], token_budget: int, overhead: int = 64
) -> list[list[int]]:
    """Row indices of ``trajs``, grouped into micro-batches under ``token_budget`` padded tokens.

    Optimal over the ways to cut the length-sorted row order into contiguous
    micro-batches (see the module docstring); O(rows x rows per micro-batch).
    """
    keys = [t.prompt_key() for t in trajs]
    # Ties are broken by content, not position: the same rows in another order (groups
    # finish in a timing-dependent order) get the same micro-batches, hence the same
    # float results; equal lengths with the same prompt stay side by side.
    order = sorted(
        range(len(trajs)),
        key=lambda i: (-len(trajs[i].response_ids), keys[i], trajs[i].response_ids, i),
    )
    n = len(order)
    best = [0.0] + [math.inf] * n  # best[j]: least cost of planning order[:j]
    cut = [0] * (n + 1)  # the last micro-batch of that plan is order[cut[j]:j]
    for j in range(1, n + 1):
        prompts: set[tuple[int, ...]] = set()
        longest_p = 0
        for i in range(j - 1, -1, -1):  # micro-batch order[i:j]; its longest response is order[i]
            row = order[i]
            prompts.add(keys[row])
            longest_p = max(longest_p, len(trajs[row].prompt_ids))
            cost = len(prompts) * longest_p + (j - i) * len(trajs[row].response_ids)
            if cost > token_budget and j - i > 1:
                break  # adding earlier (longer) rows only costs more
            if best[i] + cost + overhead < best[j]:
                best[j], cut[j] = best[i] + cost + overhead, i
    batches: list[list[int]] = []
    j = n
    while j > 0:
        batches.append(order[cut[j] : j])
        j = cut[j]
    return batches[::-1]


def tensor_fields_to(batch: Any, device: torch.device) -> dict[str, object]:
    """The dataclass ``batch``'s tensor fields moved to ``device``, by field name."""
    return {k: v.to(device) for k, v in vars(batch).items() if isinstance(v, torch.Tensor)}


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
    #: Image inputs of the distinct prompts' images, then of the responses' images
    #: (multi-turn observations), each in row-major token order ({} for text).
    prompt_pixels: dict[str, torch.Tensor] = field(default_factory=dict)
    response_pixels: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def targets(self) -> torch.Tensor:
        return self.response_ids

    def to_rows(self, per_token: torch.Tensor) -> torch.Tensor:
        """Per-token values as ``[B, R]``: here they already are (see `PackedMicroBatch`)."""
        return per_token

    def to(self, device: torch.device) -> MicroBatch:
        """The same micro-batch with its tensors on ``device`` (itself on CPU)."""
        if device.type == "cpu":
            return self
        moved = tensor_fields_to(self, device)
        for name, pixels in (("prompt_pixels", self.prompt_pixels),
                             ("response_pixels", self.response_pixels)):  # fmt: skip
            moved[name] = {k: v.to(device) for k, v in pixels.items()}
        return dataclasses.replace(self, **moved)


def _right_padded(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[row, : len(s)] = 1
    return ids, mask


def collate(
    trajs: list[Trajectory], indices: list[int], pad_id: int, pixels: PixelSource | None = None
) -> MicroBatch:
    """The `MicroBatch` of rows ``indices`` of ``trajs``; ``pixels`` gives image inputs
    (needed only when a row holds images)."""
    seqs = [trajs[i] for i in indices]
    slot: dict[tuple, int] = {}
    prompts: list[list[int]] = []
    prompt_images: list[str] = []
    prompt_index = []
    for t in seqs:
        key = t.prompt_key()
        if key not in slot:
            slot[key] = len(prompts)
            prompts.append(t.prompt_ids)
            prompt_images.extend(key[1])
        prompt_index.append(slot[key])
    response_images = [sha for t in seqs for sha in t.response_images]
    if (prompt_images or response_images) and pixels is None:
        raise ValueError("these trajectories hold images: collate needs a pixel source")
    prompt_ids, prompt_mask = _right_padded(prompts, pad_id)
    response_ids, response_mask = _right_padded([t.response_ids for t in seqs], pad_id)
    shape = response_ids.shape
    loss_mask = torch.zeros(shape, dtype=torch.float32)
    advantages = torch.zeros(shape, dtype=torch.float32)
    behaviour = torch.zeros(shape, dtype=torch.float32)
    for row, t in enumerate(seqs):
        r = len(t.response_ids)
        loss_mask[row, :r] = torch.tensor(t.loss_mask, dtype=torch.float32)
        advantages[row, :r] = torch.tensor(t.advantage_row())
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
        prompt_pixels=pixels(prompt_images) if prompt_images and pixels else {},
        response_pixels=pixels(response_images) if response_images and pixels else {},
    )
