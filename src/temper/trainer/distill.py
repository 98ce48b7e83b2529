"""On-policy distillation in the trainer (``algo.advantage = "distill"``), mixed into
`PolicyTrainer`.

At each step's start the frozen teacher runs one forward over the step's
trajectories (the same micro-batches, packing and images as the policy's own
forwards) and scores the sampled tokens (its logits over
``distill.teacher_temperature``), or, with a served teacher
(``distill.teacher = URL``), the scores it gave on the rollout side are read from
`Trajectory.teacher_logprobs`; `temper.algos.distill` turns its logprobs
and the engine's into per-token advantages, which the policy loss then uses as
full REINFORCE++'s or the critic's are used. The orchestrator left each
trajectory's group advantage of the task reward in ``advantage`` (0 with
``distill.reward_weight = 0``).

With ``distill.estimator = "full"`` the teacher's term leaves the advantages (they
keep the reward's share only) and joins the loss instead: `_full_kl_term` runs the
teacher over each micro-batch beside the policy's forward and adds the exact reverse
KL over the vocabulary at every trained position (`full_reverse_kl`).
"""

from __future__ import annotations

from typing import Any

import torch

from temper.algos.distill import distill_advantages, full_reverse_kl, reverse_kl_sums
from temper.errors import TemperError
from temper.records import Trajectory


def served_logprobs(t: Trajectory, device: torch.device) -> torch.Tensor:
    """A served teacher's logprobs of ``t``'s response tokens (`Trajectory.teacher_logprobs`)."""
    got = t.teacher_logprobs if t.teacher_logprobs is not None else []
    if len(got) != len(t.response_ids):
        raise TemperError(
            f"trajectory {t.task_id}: {len(got)} teacher logprobs for {len(t.response_ids)} "
            "response tokens; algo.advantage = 'distill' needs a teacher in the trainer or "
            "one that scored every trajectory (distill.teacher = URL)"
        )
    return torch.tensor(got, dtype=torch.float32, device=device)


class Distillation:
    """What `PolicyTrainer` adds for a teacher: its advantages and their metrics."""

    # What the host class (`PolicyTrainer`) provides.
    teacher: torch.nn.Module | None
    distill: Any  # temper.config.distill.DistillConfig
    device: torch.device
    _logprobs_no_grad: Any  # (model, trajs, rows) -> {row: response-token logprobs}
    _reduce_sums: Any  # per-process metric sums, combined
    _forward_logits: Any  # (model, micro-batch) -> its response positions' logits

    def _distill_advantages(
        self, trajs: list[Trajectory], rows: list[int]
    ) -> tuple[dict[int, torch.Tensor], dict[str, float]]:
        """Per-token advantages [R_i] of ``trajs[i] for i in rows`` and the step's
        distillation metrics: ``distill_reverse_kl`` (per sampled token, student to
        teacher, on the student's samples) and both models' mean token logprob."""
        if self.teacher is not None:
            teacher = self._logprobs_no_grad(
                self.teacher, trajs, rows, self.distill.teacher_temperature
            )
        else:  # a served teacher scored them on the rollout side (distill.teacher = URL)
            teacher = {i: served_logprobs(trajs[i], self.device) for i in rows}
        per_row: dict[int, torch.Tensor] = {}
        sums = {"distill_kl_sum": 0.0, "distill_tokens": 0.0, "distill_teacher_lp_sum": 0.0}
        for i in rows:
            t = trajs[i]
            n = len(t.response_ids)
            teacher_lp = teacher[i][:n].float()
            student_lp = torch.tensor(t.behaviour_logprobs, dtype=torch.float32).to(self.device)
            mask = torch.tensor(t.loss_mask, dtype=torch.float32).to(self.device)
            per_row[i] = distill_advantages(
                teacher_lp,
                student_lp,
                mask,
                # estimator "full": the teacher's term is in the loss (_full_kl_term).
                coef=self.distill.coef if self.distill.estimator == "sampled" else 0.0,
                outcome_advantage=t.advantage,
                reward_weight=self.distill.reward_weight,
            )
            kl, count = reverse_kl_sums(teacher_lp, student_lp, mask)
            sums["distill_kl_sum"] += kl
            sums["distill_tokens"] += count
            sums["distill_teacher_lp_sum"] += float((teacher_lp * mask).sum())
        sums = self._reduce_sums(sums)
        tokens = max(sums["distill_tokens"], 1.0)
        teacher_mean = sums["distill_teacher_lp_sum"] / tokens
        stats = {
            "distill_reverse_kl": sums["distill_kl_sum"] / tokens,
            "distill_teacher_logprob": teacher_mean,
            "distill_student_logprob": teacher_mean + sums["distill_kl_sum"] / tokens,
        }
        return per_row, stats

    def _full_kl_term(self, mb: Any, logits: torch.Tensor) -> torch.Tensor | None:
        """``distill.estimator = "full"``: the exact reverse KL at each response position of
        micro-batch ``mb`` (``[rows, width]``, differentiable in the policy's ``logits``),
        from one teacher forward over the same rows; None for any other run."""
        if self.teacher is None or self.distill.estimator != "full":
            return None
        with torch.no_grad():
            teacher_logits = self._forward_logits(self.teacher, mb)
        # A teacher may have more output columns than the student (a padded or extended
        # vocabulary; the builder checked that the student's ids mean the same to it):
        # the KL is over the ids both heads have, each distribution renormalised there.
        width = min(logits.shape[-1], teacher_logits.shape[-1])
        kl = full_reverse_kl(
            logits[..., :width], teacher_logits[..., :width], self.distill.teacher_temperature
        )
        return mb.to_rows(kl)
