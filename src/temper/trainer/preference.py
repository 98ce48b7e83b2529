"""DPO's half of `PolicyTrainer` (``trainer.mode = "dpo"``): pairs in, one update out.

A `ResponsePair` is a chosen and a rejected trajectory with the same prompt and
their reference log-probability sums (``ref_chosen``, ``ref_rejected``): the
summed logprobs of their loss-masked response tokens under the starting policy.
Whoever makes the pairs fills them in once, before the pair is trained on, with
`PreferenceTraining.sequence_logprobs` (of the policy before any update, or of
the frozen reference model with ``reference=True``), so the trainer never needs
the reference in its own step.

`PreferenceTraining.train_pairs` runs ``trainer.ppo_epochs`` passes of
``trainer.mini_batches`` optimizer steps over the pairs. Each step accumulates
gradients over micro-batches of whole pairs (`plan_pairs`: both rows of a pair
are always in the same micro-batch, so their shared prompt runs once, packed or
not), computing each row's summed response logprob, the pair's loss
(`temper.algos.preference`), and the mean over the mini-batch's pairs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from temper.algos.preference import preference_loss, preference_stats
from temper.records import Trajectory

#: What a DPO step logs, from `preference_stats`, as ``dpo/<name>``.
_STATS = ("rewards_chosen", "rewards_rejected", "margin", "reward_accuracy")


@dataclass
class ResponsePair:
    """A chosen and a rejected response to one prompt (equal ``prompt_ids``)."""

    chosen: Trajectory
    rejected: Trajectory
    #: Summed reference logprobs of each response's policy tokens; None until computed.
    ref_chosen: float | None = None
    ref_rejected: float | None = None

    @property
    def rows(self) -> tuple[Trajectory, Trajectory]:
        return self.chosen, self.rejected


def pair_rows(pairs: Sequence[ResponsePair]) -> list[Trajectory]:
    """The pairs' trajectories in order: chosen 0, rejected 0, chosen 1, ..."""
    return [t for p in pairs for t in p.rows]


def _longest(p: ResponsePair) -> int:
    return max(len(t.response_ids) for t in p.rows)


def _fed(p: ResponsePair) -> int:
    """The response tokens a packed row feeds (all but each response's last)."""
    return sum(max(len(t.response_ids) - 1, 0) for t in p.rows)


@dataclass
class _MicroBatchPlan:
    """The pairs of one planned micro-batch and what its cost depends on."""

    packed: bool
    members: list[int] = field(default_factory=list)
    prompts: dict[tuple, int] = field(default_factory=dict)  # prompt key -> its length
    widest: int = 0
    fed: int = 0

    def cost_with(self, p: ResponsePair) -> int:
        prompts = {**self.prompts, p.chosen.prompt_key(): len(p.chosen.prompt_ids)}
        if self.packed:
            return sum(prompts.values()) + self.fed + _fed(p)
        rows = 2 * len(self.members) + 2
        return len(prompts) * max(prompts.values()) + rows * max(self.widest, _longest(p))

    def add(self, i: int, p: ResponsePair) -> None:
        self.members.append(i)
        self.prompts[p.chosen.prompt_key()] = len(p.chosen.prompt_ids)
        self.widest, self.fed = max(self.widest, _longest(p)), self.fed + _fed(p)


def plan_pairs(pairs: Sequence[ResponsePair], token_budget: int, packed: bool) -> list[list[int]]:
    """Indices of ``pairs`` grouped into micro-batches of at most ``token_budget`` tokens,
    a pair never split: longest pairs first, filled greedily. The cost is the padded
    cost of `temper.trainer.batching` (distinct prompts x longest prompt + rows x
    longest response) or, ``packed``, a packed row's tokens (each distinct prompt once,
    responses less their last token). A pair over the budget gets a micro-batch alone."""
    order = sorted(range(len(pairs)), key=lambda i: (-_longest(pairs[i]), i))
    plans: list[_MicroBatchPlan] = []
    for i in order:
        if not plans or (plans[-1].members and plans[-1].cost_with(pairs[i]) > token_budget):
            plans.append(_MicroBatchPlan(packed))
        plans[-1].add(i, pairs[i])
    return [plan.members for plan in plans]


class PreferenceTraining:
    """Mixed into `PolicyTrainer`: its forward, collation and optimizer, used for pairs."""

    # What the host class (`PolicyTrainer`) provides.
    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    cfg: Any
    dpo: Any
    _reduce_sums: Any  # per-process metric sums, combined

    @torch.no_grad()
    def sequence_logprobs(self, trajs: list[Trajectory], reference: bool = False) -> list[float]:
        """The summed logprob of each trajectory's loss-masked response tokens under the
        policy as it is now (``reference``: under the frozen reference model)."""
        model = self.ref_model if reference else self.model
        if model is None:
            raise ValueError("sequence_logprobs(reference=True) needs the trainer's ref_model")
        per_row = self._logprobs_no_grad(model, trajs)
        sums = []
        for i, t in enumerate(trajs):
            mask = torch.tensor(t.loss_mask, dtype=torch.float32)
            sums.append(float((per_row[i][: len(mask)].float().cpu() * mask).sum()))
        return sums

    def train_pairs(self, pairs: list[ResponsePair]) -> dict[str, float]:
        """Update the policy on ``pairs`` (each with its reference sums); averaged metrics."""
        if not pairs:
            return {}
        if any(p.ref_chosen is None or p.ref_rejected is None for p in pairs):
            raise ValueError("train_pairs: every pair needs its reference logprobs first")
        self.model.train()
        m = self.cfg.mini_batches
        chunks = [c for c in (list(range(k, len(pairs), m)) for k in range(m)) if c]
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, float] = defaultdict(float)
        for _epoch in range(self.cfg.ppo_epochs):
            for chunk in chunks:
                for name, (value, weight) in self._pair_step([pairs[i] for i in chunk]).items():
                    sums[name] += value * weight
                    counts[name] += weight
        return {name: sums[name] / max(counts[name], 1e-12) for name in sums}

    def _pair_step(self, batch: list[ResponsePair]) -> dict[str, tuple[float, float]]:
        """One optimizer step on ``batch``; stats map name -> (value, weight)."""
        trajs = pair_rows(batch)
        acc: dict[str, float] = defaultdict(float)
        self.optimizer.zero_grad(set_to_none=True)
        for group in self._pair_plan(batch, self._packs(trajs)):
            self._pair_backward(trajs, group, [batch[i] for i in group], len(batch), acc)
        acc = self._reduce_sums(acc)
        grad_norm = self._clip_grads()
        lr = self.scheduler.get_last_lr()[0]
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.scheduler.step()
        n = float(len(batch))
        stats = {f"dpo/{k}": (acc[k] / n, n) for k in ("loss", *_STATS)}
        stats["dpo/kl"] = (acc["kl"] / max(acc["chosen_tokens"], 1.0), acc["chosen_tokens"])
        tokens = float(sum(t.num_policy_tokens for t in trajs))
        return {
            **stats,
            "loss": stats["dpo/loss"],
            "grad_norm": (grad_norm, 1.0),
            "lr": (lr, 1.0),
            "train_tokens": (tokens, 1.0),
        }

    def _pair_plan(self, batch: list[ResponsePair], packed: bool) -> list[list[int]]:
        """The micro-batches (indices of ``batch``'s pairs) this process trains: all of
        them here; a sharded rank takes its slice (`ShardedPolicyTrainer`)."""
        return plan_pairs(batch, self.cfg.micro_batch_tokens, packed)

    def _pair_backward(
        self,
        trajs: list[Trajectory],
        group: list[int],
        pairs: list[ResponsePair],
        total_pairs: int,
        acc: dict[str, float],
    ) -> None:
        """Forward and backward of one micro-batch of whole pairs (``group``, indices of
        the mini-batch's pairs); the loss is over ``total_pairs`` so micro-batches add up
        to the mini-batch's mean."""
        rows = [r for i in group for r in (2 * i, 2 * i + 1)]
        mb = self._collate(trajs, rows)
        logits = self._forward_logits(self.model, mb)
        logprobs = mb.to_rows(self._token_logprobs(logits, mb.targets))
        seq = (logprobs * mb.loss_mask).sum(dim=-1)
        pi_c, pi_r = seq[0::2], seq[1::2]
        ref_c = torch.tensor([p.ref_chosen for p in pairs], device=seq.device)
        ref_r = torch.tensor([p.ref_rejected for p in pairs], device=seq.device)
        d = self.dpo
        loss = preference_loss(d.loss, pi_c, pi_r, ref_c, ref_r, d.beta, d.label_smoothing)
        (loss.sum() / total_pairs).backward()
        tokens = mb.loss_mask[0::2].sum()
        stats = preference_stats(pi_c, pi_r, ref_c, ref_r, d.beta, chosen_tokens=tokens)
        n = len(pairs)
        acc["loss"] += float(loss.detach().sum())
        for key in _STATS:
            acc[key] += float(stats[key]) * n
        acc["kl"] += float(stats["kl"] * tokens)
        acc["chosen_tokens"] += float(tokens)
