"""On-policy distillation's per-token advantages (``algo.advantage = "distill"``).

The student samples a response; a frozen teacher scores the sampled tokens in one
forward. The reverse KL from the student to the teacher, estimated on the student's
own samples, is a sum over the sampled tokens of

    log p_student(x_t | x_<t) - log p_teacher(x_t | x_<t),

so a token's advantage is its negative, ``log p_teacher - log p_student`` (Agarwal
et al. 2024, GKD; Qwen3's report; Thinking Machines' "On-Policy Distillation"): the
policy gradient then lowers the reverse KL. Each token keeps its own term (no sum
over the tokens after it, the discount-0 form those reports use). The student's
logprob is the engine's, recorded when it sampled the token, so the advantage costs
one teacher forward and no extra student forward. A task reward can be mixed in:
``reward_weight`` times the sequence's group advantage joins every sampled token.
Tokens the policy did not sample (observations) get 0.

`full_reverse_kl` is the other estimator (``distill.estimator = "full"``, GKD's
token-level form): the KL at each sampled position taken exactly over the vocabulary
from both models' logits, a loss term rather than an advantage.
"""

from __future__ import annotations

import torch


def distill_advantages(
    teacher_logprobs: torch.Tensor,
    student_logprobs: torch.Tensor,
    mask: torch.Tensor,
    coef: float = 1.0,
    outcome_advantage: float = 0.0,
    reward_weight: float = 0.0,
) -> torch.Tensor:
    """Per-token advantages [R] of one response:
    ``mask x (coef x (teacher - student) + reward_weight x outcome_advantage)``.

    ``teacher_logprobs`` and ``student_logprobs`` are the two models' logprobs of the
    sampled tokens [R]; ``mask`` is 1 on tokens the policy sampled.
    """
    if not teacher_logprobs.shape == student_logprobs.shape == mask.shape:
        raise ValueError(
            f"teacher logprobs {tuple(teacher_logprobs.shape)}, student logprobs "
            f"{tuple(student_logprobs.shape)} and mask {tuple(mask.shape)} must match"
        )
    m = mask.to(teacher_logprobs.dtype)
    gap = teacher_logprobs - student_logprobs.to(teacher_logprobs.dtype)
    return m * (coef * gap + reward_weight * outcome_advantage)


def reverse_kl_sums(
    teacher_logprobs: torch.Tensor, student_logprobs: torch.Tensor, mask: torch.Tensor
) -> tuple[float, float]:
    """(sum of log p_student - log p_teacher over the sampled tokens, their count): the
    per-token reverse KL estimate is their ratio, summed first so that rows and
    processes add up."""
    m = mask.to(teacher_logprobs.dtype)
    gap = student_logprobs.to(teacher_logprobs.dtype) - teacher_logprobs
    return float((m * gap).sum()), float(m.sum())


def full_reverse_kl(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, teacher_temperature: float = 1.0
) -> torch.Tensor:
    """The exact reverse KL at each position, ``sum_v p_s(v) (log p_s(v) - log p_t(v))``
    over the whole vocabulary (``distill.estimator = "full"``): ``[...]`` from logits
    ``[..., V]``, differentiable in the student's. The teacher's logits are divided by
    ``teacher_temperature`` first; both are taken in fp32.

    Its gradient is the expectation of what the sampled estimator above gives on one
    token, so a step is as long but far less noisy; it costs the teacher's logits over
    the vocabulary for every trained position, where the sampled estimator needs one
    logprob per token.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student logits {tuple(student_logits.shape)} and teacher logits "
            f"{tuple(teacher_logits.shape)} must match (a teacher with another vocabulary?)"
        )
    log_s = torch.log_softmax(student_logits.float(), dim=-1)
    log_t = torch.log_softmax(teacher_logits.float() / teacher_temperature, dim=-1)
    return (log_s.exp() * (log_s - log_t)).sum(dim=-1)
