"""The configured policy objective and full REINFORCE++'s returns, for `PolicyTrainer`.

Thin glue between `AlgoConfig` and the pure functions of `temper.algos`
(docs/algorithms.md): which per-token loss the trainer minimises, and the
per-token returns REINFORCE++ builds from the outcome reward and the KL to the
reference model before the trainer normalises them over the batch.
"""

from __future__ import annotations

import torch

from temper.algos import (
    cispo_loss,
    gspo_loss,
    kl_estimate,
    ppo_clip_loss,
    reinforce_pp_token_returns,
)
from temper.config.schema import AlgoConfig
from temper.records import Trajectory


def policy_objective(
    algo: AlgoConfig,
    logprobs: torch.Tensor,
    anchor: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The per-token loss ``[B, T]`` and stats of ``algo.policy_loss``; ``anchor`` holds
    the logprobs the ratio is taken against (proximal or behaviour policy)."""
    if algo.policy_loss == "gspo":
        return gspo_loss(
            logprobs, anchor, advantages, mask, algo.gspo_clip_low, algo.gspo_clip_high
        )
    if algo.policy_loss == "cispo":
        return cispo_loss(
            logprobs, anchor, advantages, mask, algo.cispo_clip_low, algo.cispo_clip_high
        )
    return ppo_clip_loss(
        logprobs,
        anchor,
        advantages,
        mask,
        clip_low=algo.clip_low,
        clip_high=algo.clip_high,
        dual_clip=algo.dual_clip,
    )


def reinforce_pp_returns(
    algo: AlgoConfig,
    trajs: list[Trajectory],
    rows: list[int],
    old: dict[int, torch.Tensor] | None,
    ref: dict[int, torch.Tensor] | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(returns, loss mask, KL), each ``[len(rows), longest response]`` on the CPU.

    The outcome reward is each trajectory's ``advantage`` (what
    `compute_advantages("reinforce_pp")` leaves there). The KL is
    ``algo.reward_kl_estimator`` of ``old`` (the policy at the step's start, the
    one that sampled up to train/inference mismatch and staleness) against
    ``ref``; it is zero when either is missing or ``reward_kl_coef`` is 0.
    """
    width = max([len(trajs[i].response_ids) for i in rows], default=1)
    mask = torch.zeros(len(rows), width)
    kl = torch.zeros(len(rows), width)
    outcome = torch.tensor([trajs[i].advantage for i in rows], dtype=torch.float32)
    use_kl = old is not None and ref is not None and algo.reward_kl_coef > 0
    for k, i in enumerate(rows):
        n = len(trajs[i].response_ids)
        mask[k, :n] = torch.tensor(trajs[i].loss_mask, dtype=torch.float32)
        if use_kl:
            kl[k, :n] = kl_estimate(
                old[i][:n].float().cpu(), ref[i][:n].float().cpu(), kind=algo.reward_kl_estimator
            )
    kl = kl * mask
    return reinforce_pp_token_returns(outcome, kl, mask, algo.reward_kl_coef), mask, kl
