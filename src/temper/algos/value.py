"""PPO's learned-value pieces as pure functions: GAE, turn-level GAE, the clipped value loss.

All tensors are ``[B, T]`` rows (one per trajectory, right-padded), with a
``mask`` of the positions that take part. For token-level GAE the mask is the
loss mask: the model's own tokens. A multi-turn episode's observation tokens
sit between turns with mask 0; they are skipped, not stepped through, so the
time axis is the model's tokens in order and the value after the last turn's
last token is that of the next model token, in the next turn.

GAE (Schulman et al. 2016, "High-Dimensional Continuous Control Using
Generalized Advantage Estimation"), over the masked positions t of a row, with
t' the next masked position (none after the last: terminal, V = 0):

    delta_t = r_t + gamma * V(t') - V(t)
    A_t     = delta_t + gamma * lam * A(t')
    R_t     = A_t + V(t)                     (the value target, the lambda-return)

With gamma = lam = 1, A_t = (sum of rewards from t on) - V(t): the Monte-Carlo
return against a learned baseline.

Turn-level GAE runs the same recursion with one step per assistant turn: the
state of turn k is its first token, V_k the value there, r_k the turn's reward
(`temper.algos.turn_credit.episode_turn_rewards`). `turn_gae` takes those
per-turn values already gathered, ``[B, K]``.

The value loss (PPO2's clipped form, as in OpenAI baselines):

    L_t = 0.5 * max((V_t - R_t)^2, (clip(V_t, V_old - eps, V_old + eps) - R_t)^2)

``eps = None`` is the plain squared error.
"""

from __future__ import annotations

import torch


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both ``[B, T]`` and 0 off ``mask``; see the module doc.

    ``rewards`` off the mask must be 0 (a reward belongs to a model token)."""
    if not rewards.shape == values.shape == mask.shape:
        raise ValueError(
            f"gae: rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and mask "
            f"{tuple(mask.shape)} must have one shape"
        )
    on = mask.bool()
    rewards = rewards.detach().float()
    values = values.detach().float()
    advantages = torch.zeros_like(values)
    next_value = values.new_zeros(values.shape[0])
    next_adv = values.new_zeros(values.shape[0])
    for t in range(values.shape[1] - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        m = on[:, t]
        advantages[:, t] = torch.where(m, adv, 0.0)
        # Off the mask (an observation token, padding) the recursion passes through.
        next_value = torch.where(m, values[:, t], next_value)
        next_adv = torch.where(m, adv, next_adv)
    returns = (advantages + values) * on
    return advantages, returns


#: Turn-level GAE is `gae` with one step per turn: ``[B, K]`` per-turn rewards and values
#: (the value at each turn's first token) and the mask of the K turns each row has.
turn_gae = gae


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token clipped value loss ``[B, T]`` (0 off ``mask``) and its stats:
    ``value_clip_frac``, the fraction of masked tokens where the clipped term was the
    larger (the clip bound the update)."""
    maskf = mask.to(values.dtype)
    err = (values - returns) ** 2
    if clip is None:
        return 0.5 * err * maskf, {"value_clip_frac": 0.0}
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    err_clipped = (clipped - returns) ** 2
    n = float(maskf.sum())
    frac = float(((err_clipped > err).to(maskf.dtype) * maskf).sum()) / max(n, 1.0)
    return 0.5 * torch.maximum(err, err_clipped) * maskf, {"value_clip_frac": frac}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the masked tokens: 1 is a perfect critic, 0 one no
    better than a constant, below 0 worse. NaN when the returns do not vary."""
    on = mask.bool()
    r, v = returns[on].double(), values[on].double()
    if r.numel() < 2:
        return float("nan")
    var_r = float(r.var())
    if var_r == 0.0:
        return float("nan")
    return 1.0 - float((r - v).var()) / var_r
