"""Group-relative advantage estimators.

Every function takes the rewards of a batch laid out as `[num_groups, group_size]`
(one row per prompt, one column per sampled completion of that prompt) and returns
advantages of the same shape. A sequence-level advantage is later broadcast over
the sequence's policy tokens by the loss. Full REINFORCE++ (the end of this
module) is the exception: its advantages are per token and need the logprobs,
so the trainer finishes them.

Standard deviations use the *unbiased* (Bessel-corrected, divide by n - 1)
convention, the default of `torch.std` and the one TRL, verl and OpenRLHF use.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

AdvantageName = Literal[
    "grpo", "grpo_no_std", "dr_grpo", "rloo", "reinforce_pp_baseline", "reinforce_pp", "gae"
]


def _as_groups(rewards: torch.Tensor) -> torch.Tensor:
    """Check the `[num_groups, group_size]` layout and return a floating-point tensor."""
    if rewards.dim() != 2:
        raise ValueError(
            f"rewards must have shape [num_groups, group_size], got {tuple(rewards.shape)}"
        )
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    return rewards


def grpo_advantages(
    rewards: torch.Tensor, scale_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO outcome advantages (Shao et al. 2024, DeepSeekMath, §4.1.2).

        A_i = (r_i - mean_g(r)) / (std_g(r) + eps)

    where mean_g and std_g are taken over the completions of the same prompt (the
    row), and std_g is the unbiased sample standard deviation (divide by G - 1).
    With `scale_by_std=False` this is A_i = r_i - mean_g(r). A group of size 1 has
    no spread to compare against and gets advantage 0.
    """
    rewards = _as_groups(rewards)
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    if not scale_by_std:
        return centered
    if rewards.shape[1] < 2:
        return torch.zeros_like(rewards)
    std = rewards.std(dim=1, keepdim=True, unbiased=True)
    return centered / (std + eps)


def dr_grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO advantages (Liu et al. 2025, "Understanding R1-Zero-Like Training").

        A_i = r_i - mean_g(r)

    GRPO without the division by the group's standard deviation, which the paper
    shows biases updates towards prompts that are too easy or too hard.
    """
    rewards = _as_groups(rewards)
    return rewards - rewards.mean(dim=1, keepdim=True)


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out advantages (Ahmadian et al. 2024, "Back to Basics").

        A_i = r_i - 1/(G-1) * sum_{j != i} r_j  =  G/(G-1) * (r_i - mean_g(r))

    Each completion's baseline is the mean reward of the other G - 1 completions of
    the same prompt. Needs G >= 2.
    """
    rewards = _as_groups(rewards)
    group_size = rewards.shape[1]
    if group_size < 2:
        raise ValueError(f"RLOO needs at least 2 completions per prompt, got {group_size}")
    others_mean = (rewards.sum(dim=1, keepdim=True) - rewards) / (group_size - 1)
    return rewards - others_mean


def reinforce_pp_baseline_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++-baseline advantages (Hu 2025, "REINFORCE++", the group-baseline variant).

        a_i = r_i - mean_g(r)                   (group mean as baseline)
        A_i = a_i / (std_batch(a) + eps)        (one std over the whole batch)

    std_batch is the unbiased standard deviation of all a in the batch (every group
    and every completion). Normalising by the batch instead of by each group keeps
    the relative scale between prompts. The batch mean of a is zero by
    construction (equal group sizes), so it is not subtracted again. A batch with
    a single element gets advantage 0.
    """
    centered = dr_grpo_advantages(rewards)
    if centered.numel() < 2:
        return torch.zeros_like(centered)
    return centered / (centered.std(unbiased=True) + eps)


def compute_advantages(name: AdvantageName, rewards: torch.Tensor) -> torch.Tensor:
    """Compute advantages with the estimator called `name`, using its default settings.

    `"grpo"`: `grpo_advantages`; `"grpo_no_std"`: `grpo_advantages(scale_by_std=False)`
    (numerically the same as `"dr_grpo"`); `"dr_grpo"`; `"rloo"`;
    `"reinforce_pp_baseline"`; `"reinforce_pp"`: the rewards themselves, unchanged (full
    REINFORCE++ has no group baseline: its per-token advantages come from these outcome
    rewards, the per-token KL and a batch normalisation, which the trainer computes with
    `reinforce_pp_token_returns` and `normalise_over_batch`, where the logprobs are);
    `"gae"`: the rewards too (PPO with a critic: the trainer computes GAE against the
    value function, `temper.trainer.critic`).
    """
    if name == "grpo":
        return grpo_advantages(rewards)
    if name == "grpo_no_std":
        return grpo_advantages(rewards, scale_by_std=False)
    if name == "dr_grpo":
        return dr_grpo_advantages(rewards)
    if name == "rloo":
        return rloo_advantages(rewards)
    if name == "reinforce_pp_baseline":
        return reinforce_pp_baseline_advantages(rewards)
    if name in ("reinforce_pp", "gae"):
        return _as_groups(rewards).clone()
    raise ValueError(
        f"unknown advantage estimator {name!r}; expected one of {get_args(AdvantageName)}"
    )


def reinforce_pp_token_returns(
    outcome: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> torch.Tensor:
    """Per-token returns of full REINFORCE++ (Hu 2025, "REINFORCE++", arXiv:2501.03262).

    The KL to the reference policy is part of the reward, token by token, and the
    outcome reward arrives at the sequence's last policy token:

        r_t = -kl_coef * KL_t + 1[t = last policy token] * outcome
        G_t = sum_{s >= t} r_s            (undiscounted, gamma = 1, over policy tokens)

    ``outcome`` is ``[B]``; ``kl`` and ``mask`` are ``[B, T]`` (``kl`` a per-token
    estimate, e.g. `temper.algos.kl.kl_estimate`, of the sampling policy against
    the reference). Tokens off the mask (padding, a multi-turn episode's
    observations) carry no reward and get return 0; a policy token's return still
    counts the rewards of later turns. A row without policy tokens is all zeros.
    Normalise the result over the batch with `normalise_over_batch`.
    """
    maskf = mask.to(kl.dtype)
    rewards = -kl_coef * kl * maskf
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(maskf)
    last = torch.where(mask.bool(), positions, -1).max(dim=-1).values  # [B], -1: no tokens
    rows = torch.nonzero(last >= 0).squeeze(-1)
    rewards = rewards.index_put((rows, last[rows]), outcome.to(kl.dtype)[rows], accumulate=True)
    returns = rewards.flip(-1).cumsum(-1).flip(-1)
    return returns * maskf


def masked_moments(values: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    """(count, sum, sum of squares) of ``values`` over ``mask``, in float64.

    Sums, so that processes holding parts of a batch can add theirs before
    `normalise_over_batch` (which then normalises over the whole batch)."""
    maskf = mask.to(torch.float64)
    v = values.detach().to(torch.float64) * maskf
    return float(maskf.sum()), float(v.sum()), float((v * v).sum())


def normalise_over_batch(
    values: torch.Tensor,
    mask: torch.Tensor,
    moments: tuple[float, float, float] | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Global advantage normalisation of REINFORCE++: one mean and std over every
    policy token of the batch (not per group, not per sequence):

        A_t = (G_t - mean_batch(G)) / (std_batch(G) + eps)

    std is the unbiased sample standard deviation over the batch's policy tokens.
    ``moments`` are the batch's `masked_moments` (default: those of ``values``
    itself); pass the sums over all processes when each holds part of the batch.
    Entries off the mask are 0. A batch with fewer than two policy tokens gets 0.
    """
    count, total, total_sq = masked_moments(values, mask) if moments is None else moments
    maskf = mask.to(values.dtype)
    if count < 2:
        return torch.zeros_like(values)
    mean = total / count
    var = max(total_sq - count * mean * mean, 0.0) / (count - 1)
    return (values - mean) / (var**0.5 + eps) * maskf
