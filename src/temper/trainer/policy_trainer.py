"""The policy update: recompute logprobs, PPO-clip loss, AdamW step.

Plain PyTorch. One call to `train_step` takes a batch of scored trajectories
(advantages already set), runs `ppo_epochs` passes of `mini_batches` optimizer
steps each, and returns metrics. Each optimizer step accumulates gradients
over micro-batches cut by a padded-token budget, each running its distinct
prompts once for all their responses (`temper.trainer.forward`); the loss is
normalised by the mini-batch's global token/sequence counts so accumulation
equals one big batch.

It does not generate, score or talk to the engine: the orchestrator does that.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict

import torch

from temper.algos import (
    aggregate_loss,
    entropy_from_logits,
    kl_estimate,
    ppo_clip_loss,
    token_logprobs,
)
from temper.config.schema import AlgoConfig, TrainerConfig
from temper.rollout.trajectory import Trajectory
from temper.trainer.batching import MicroBatch, collate, plan_micro_batches
from temper.trainer.forward import response_logits
from temper.trainer.optim import build_optimizer


class PolicyTrainer:
    """Owns the trainable policy, its optimizer and (optionally) a frozen reference."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: TrainerConfig,
        algo: AlgoConfig,
        total_steps: int,
        pad_id: int,
        ref_model: torch.nn.Module | None = None,
    ) -> None:
        self.model = model
        self.cfg = cfg
        self.algo = algo
        self.pad_id = pad_id
        self.ref_model = ref_model
        if ref_model is not None:
            ref_model.eval().requires_grad_(False)
        optimizer_steps = total_steps * cfg.ppo_epochs * cfg.mini_batches
        self.optimizer, self.scheduler = build_optimizer(model, cfg, optimizer_steps)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.cfg.precision == "bf16":
            return torch.autocast(device_type="cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _forward_logits(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        with self._autocast():
            return response_logits(model, mb)

    @torch.no_grad()
    def _logprobs_no_grad(
        self, model: torch.nn.Module, trajs: list[Trajectory]
    ) -> dict[int, torch.Tensor]:
        """Per-trajectory response-token logprobs [R] (padding dropped later by masks)."""
        result: dict[int, torch.Tensor] = {}
        for idx in plan_micro_batches(trajs, self.cfg.micro_batch_tokens):
            mb = collate(trajs, idx, self.pad_id)
            lp = token_logprobs(self._forward_logits(model, mb), mb.targets)
            for row, i in enumerate(idx):
                result[i] = lp[row]
        return result

    def train_step(self, trajs: list[Trajectory]) -> dict[str, float]:
        """Update the policy on `trajs`; returns averaged metrics."""
        if not trajs:
            return {}
        self.model.train()
        needs_old = self.cfg.ppo_epochs > 1 or self.cfg.mini_batches > 1
        old = self._logprobs_no_grad(self.model, trajs) if needs_old else None
        ref = self._logprobs_no_grad(self.ref_model, trajs) if self.ref_model is not None else None
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, float] = defaultdict(float)
        order = list(range(len(trajs)))
        for _epoch in range(self.cfg.ppo_epochs):
            for k in range(self.cfg.mini_batches):
                chunk = order[k :: self.cfg.mini_batches]
                if not chunk:
                    continue
                stats = self._optimizer_step([trajs[i] for i in chunk], chunk, old, ref)
                for name, (value, weight) in stats.items():
                    sums[name] += value * weight
                    counts[name] += weight
        return {name: sums[name] / max(counts[name], 1e-12) for name in sums}

    def _optimizer_step(
        self,
        trajs: list[Trajectory],
        global_idx: list[int],
        old: dict[int, torch.Tensor] | None,
        ref: dict[int, torch.Tensor] | None,
    ) -> dict[str, tuple[float, float]]:
        """One optimizer step over `trajs`; stats map name -> (value, weight)."""
        total_tokens = float(sum(t.num_policy_tokens for t in trajs))
        total_seqs = float(len(trajs))
        stats: dict[str, tuple[float, float]] = {}
        acc: dict[str, float] = defaultdict(float)
        self.optimizer.zero_grad(set_to_none=True)
        for idx in plan_micro_batches(trajs, self.cfg.micro_batch_tokens):
            mb = collate(trajs, idx, self.pad_id)
            logits = self._forward_logits(self.model, mb)
            logprobs = token_logprobs(logits, mb.targets)
            fresh = [
                (row, trajs[i]) for row, i in enumerate(idx) if trajs[i].trainer_logprobs is None
            ]
            if fresh:  # first pass: the weights the engine sampled with; one copy to host
                rows = logprobs.detach().tolist()
                for row, t in fresh:
                    t.trainer_logprobs = rows[row][: len(t.response_ids)]
            if old is not None:
                old_lp = _stack_rows([old[global_idx[i]] for i in idx], logprobs.shape)
            else:
                old_lp = logprobs.detach()
            per_token, clip_stats = ppo_clip_loss(
                logprobs,
                old_lp,
                mb.advantages,
                mb.loss_mask,
                clip_low=self.algo.clip_low,
                clip_high=self.algo.clip_high,
                dual_clip=self.algo.dual_clip,
            )
            mask = mb.loss_mask
            n_tok = float(mask.sum())
            if ref is not None and self.algo.kl_coef > 0:
                ref_lp = _stack_rows([ref[global_idx[i]] for i in idx], logprobs.shape)
                kl = kl_estimate(logprobs, ref_lp, kind=self.algo.kl_estimator)
                per_token = per_token + self.algo.kl_coef * kl
                acc["kl"] += float((kl.detach() * mask).sum())
            if self.algo.entropy_coef > 0:
                ent = entropy_from_logits(logits)
                per_token = per_token - self.algo.entropy_coef * ent
            else:
                with torch.no_grad():
                    ent = entropy_from_logits(logits)
            loss = aggregate_loss(
                per_token,
                mask,
                self.algo.loss_agg,
                total_tokens=total_tokens,
                total_seqs=total_seqs,
            )
            loss.backward()
            acc["loss"] += float(loss.detach())
            acc["entropy"] += float((ent.detach() * mask).sum())
            diff = (logprobs.detach() - mb.behaviour_logprobs).abs() * mask
            acc["mismatch_abs"] += float(diff.sum())
            acc["mismatch_max"] = max(acc["mismatch_max"], float(diff.max()) if n_tok else 0.0)
            for key in ("clip_frac_low", "clip_frac_high"):
                acc[key] += float(clip_stats[key]) * n_tok
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        lr = self.scheduler.get_last_lr()[0]
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        self.scheduler.step()
        w = max(total_tokens, 1.0)
        stats["loss"] = (acc["loss"], 1.0)
        stats["grad_norm"] = (float(grad_norm), 1.0)
        stats["lr"] = (lr, 1.0)
        stats["entropy"] = (acc["entropy"] / w, w)
        stats["train_infer_logprob_diff"] = (acc["mismatch_abs"] / w, w)
        stats["train_infer_logprob_diff_max"] = (acc["mismatch_max"], 1.0)
        stats["clip_frac_low"] = (acc["clip_frac_low"] / w, w)
        stats["clip_frac_high"] = (acc["clip_frac_high"] / w, w)
        if ref is not None and self.algo.kl_coef > 0:
            stats["kl"] = (acc["kl"] / w, w)
        stats["train_tokens"] = (total_tokens, 1.0)
        return stats

    def engine_state_dict(self) -> dict[str, torch.Tensor]:
        """Current weights, detached, for publishing to engines."""
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


def _stack_rows(rows: list[torch.Tensor], shape: torch.Size) -> torch.Tensor:
    """Stack per-trajectory [R_i] tensors into `shape`, zero-padding on the right."""
    out = torch.zeros(shape, dtype=torch.float32)
    for r, row in enumerate(rows):
        n = min(row.shape[0], shape[1])
        out[r, :n] = row[:n]
    return out
