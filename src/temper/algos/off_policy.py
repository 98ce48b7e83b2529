"""Importance-sampling corrections for off-policy (stale or mismatched) rollouts.

A token was sampled by the behaviour policy mu: the engine, possibly a few
weight versions behind the trainer and, even at the same version, computing
with different kernels. The trainer's loss is built around the *proximal*
policy pi_prox: the trainer's own logprobs at the weights it holds when the
step starts (recomputed, no gradient). With r = pi_theta / pi_prox the PPO
ratio and rho = pi_prox / mu the behaviour importance ratio:

- ``none``: ``loss = ppo(r, A)``. Ignores mu; exact only on-policy.
- ``behaviour``: ``loss = ppo(pi_theta / mu, A)``: classic PPO with mu as the
  old policy (the clip is centred on the stale policy, so stale tokens are
  often clipped to zero gradient).
- ``tis``: ``loss = min(rho, C) * ppo(r, A)``: truncated importance sampling
  (Ionides 2008; applied to the train/inference mismatch by Yao et al. 2025,
  "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training").
- ``mis``: ``loss = rho * 1[low <= rho <= C] * ppo(r, A)``: masked importance
  sampling; tokens (or whole sequences) whose ratio leaves the band get no
  gradient at all instead of a truncated one (Liu et al. 2025, "When Speed
  Kills Stability: Demystifying RL Collapse from the Training-Inference
  Mismatch").
- ``decoupled``: ``loss = rho * ppo(r, A)``: the decoupled PPO objective
  (Hilton et al. 2022, "Batch Size-Invariance for Policy Optimization"; used
  for asynchronous RL by AReaL, Fu et al. 2025): the clip trusts the proximal
  policy, the untruncated rho corrects for sampling under mu.

``level = "sequence"`` (tis and mis) uses one ratio per sequence,
``rho_seq = prod_t rho_t`` over its sampled tokens, broadcast to its tokens;
``"token"`` uses ``rho_t`` per token. All weights are constants (no gradient).
"""

from __future__ import annotations

from typing import Literal

import torch

Correction = Literal["none", "behaviour", "tis", "mis", "decoupled"]
Level = Literal["token", "sequence"]

#: Log-ratios are clamped here before exp so a sequence-level product cannot overflow.
_MAX_LOG_RATIO = 80.0


def importance_weights(
    prox_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    correction: Correction,
    level: Level = "token",
    cap: float = 2.0,
    low: float = 0.0,
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """Per-token weights ``[B, T]`` multiplying the PPO loss, and detached stats.

    ``prox_logprobs`` and ``behaviour_logprobs`` are ``[B, T]``; ``mask`` marks
    sampled tokens. Returns ``(None, stats)`` for ``none`` and ``behaviour``
    (no weight). ``cap`` is C (tis truncation, mis upper bound); ``low`` the mis
    lower bound. Stats, over masked tokens: ``is_ratio_mean/max/min`` (rho before
    truncation or masking), ``is_weight_mean``, ``is_truncated_frac`` (tis),
    ``is_masked_frac`` (mis), ``is_log_ratio_abs_mean`` (the train/inference gap).
    """
    if cap <= 0 or low < 0 or low >= cap:
        raise ValueError(f"need 0 <= low < cap, got low={low}, cap={cap}")
    valid = mask.bool()
    maskf = valid.to(prox_logprobs.dtype)
    count = maskf.sum().clamp(min=1)
    log_rho = torch.where(valid, prox_logprobs - behaviour_logprobs, torch.zeros_like(maskf))
    log_rho = log_rho.detach()
    if level == "sequence" and correction in ("tis", "mis"):
        seq = log_rho.sum(dim=-1, keepdim=True).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        rho = seq.exp().expand_as(log_rho)
    else:
        rho = log_rho.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).exp()
    stats = _ratio_stats(rho, log_rho, valid, maskf, count)
    if correction in ("none", "behaviour"):
        return None, stats
    if correction == "tis":
        weights = rho.clamp(max=cap)
        stats["is_truncated_frac"] = ((rho > cap).to(maskf.dtype) * maskf).sum() / count
    elif correction == "mis":
        keep = (rho >= low) & (rho <= cap)
        weights = torch.where(keep, rho, torch.zeros_like(rho))
        stats["is_masked_frac"] = ((~keep).to(maskf.dtype) * maskf).sum() / count
    elif correction == "decoupled":
        weights = rho
    else:
        raise ValueError(f"unknown off-policy correction {correction!r}")
    weights = weights * maskf
    stats["is_weight_mean"] = weights.sum() / count
    return weights, stats


def _ratio_stats(
    rho: torch.Tensor,
    log_rho: torch.Tensor,
    valid: torch.Tensor,
    maskf: torch.Tensor,
    count: torch.Tensor,
) -> dict[str, torch.Tensor]:
    big = torch.finfo(rho.dtype).max
    zero = rho.new_zeros(())
    any_valid = maskf.sum() > 0
    return {
        "is_ratio_mean": (rho * maskf).sum() / count,
        "is_ratio_max": torch.where(any_valid, torch.where(valid, rho, -big).max(), zero),
        "is_ratio_min": torch.where(any_valid, torch.where(valid, rho, big).min(), zero),
        "is_log_ratio_abs_mean": (log_rho.abs() * maskf).sum() / count,
    }
