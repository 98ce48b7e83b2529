"""RL math as pure tensor functions: advantages, log-probabilities, policy losses, KL;
`preference.py`: DPO and IPO losses on sequence logprobs; `distill.py`: on-policy
distillation's per-token advantages."""

from temper.algos.advantages import (
    AdvantageName,
    compute_advantages,
    dr_grpo_advantages,
    grpo_advantages,
    masked_moments,
    normalise_over_batch,
    reinforce_pp_baseline_advantages,
    reinforce_pp_token_returns,
    rloo_advantages,
)
from temper.algos.kl import KLKind, kl_estimate
from temper.algos.logprobs import entropy_from_logits, token_logprobs
from temper.algos.losses import AggregationMode, aggregate_loss, ppo_clip_loss
from temper.algos.objectives import PolicyLossName, cispo_loss, gspo_loss

__all__ = [
    "AdvantageName",
    "AggregationMode",
    "KLKind",
    "PolicyLossName",
    "aggregate_loss",
    "cispo_loss",
    "compute_advantages",
    "dr_grpo_advantages",
    "entropy_from_logits",
    "grpo_advantages",
    "gspo_loss",
    "kl_estimate",
    "masked_moments",
    "normalise_over_batch",
    "ppo_clip_loss",
    "reinforce_pp_baseline_advantages",
    "reinforce_pp_token_returns",
    "rloo_advantages",
    "token_logprobs",
]
