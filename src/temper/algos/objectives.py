"""Policy objectives beside the PPO clip (`temper.algos.losses.ppo_clip_loss`): GSPO and CISPO.

Both take the arguments of `ppo_clip_loss` and return the same things: a
per-token loss ``[B, T]`` (zero off the mask) to reduce with
`temper.algos.losses.aggregate_loss`, and a dict of detached 0-d stats. So the
trainer multiplies them by off-policy importance weights and adds KL and
entropy terms exactly as it does for PPO.

``old_logprobs`` is the policy the ratio is taken against: the proximal policy,
or the engine's logprobs under ``off_policy_correction = "behaviour"``.
"""

from __future__ import annotations

from typing import Literal

import torch

PolicyLossName = Literal["ppo", "gspo", "cispo"]


def _per_token(
    logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(advantages as ``[B, T]``, the mask as bool and as floats, zeros): what every
    objective here starts from; ``advantages`` may be one per sequence, ``[B]``."""
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    valid = mask.bool()
    return (
        advantages.expand_as(logprobs),
        valid,
        valid.to(logprobs.dtype),
        torch.zeros_like(logprobs),
    )


def _masked_mean(values: torch.Tensor, maskf: torch.Tensor) -> torch.Tensor:
    return (values * maskf).sum() / maskf.sum().clamp(min=1)


def _extremes(values: torch.Tensor, valid: torch.Tensor, prefix: str) -> dict[str, torch.Tensor]:
    """``{prefix}_max`` / ``{prefix}_min`` over ``valid`` entries (0 when there are none)."""
    big = torch.finfo(values.dtype).max
    zero = values.new_zeros(())
    anyv = valid.any()
    return {
        f"{prefix}_max": torch.where(anyv, torch.where(valid, values, -big).max(), zero),
        f"{prefix}_min": torch.where(anyv, torch.where(valid, values, big).min(), zero),
    }


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071), token form.

    GSPO replaces PPO's per-token ratio with one ratio per sequence, the
    length-normalised likelihood ratio (the geometric mean of the token ratios)

        s_i = (pi(y_i) / pi_old(y_i)) ** (1 / |y_i|)
            = exp( 1/|y_i| * sum_t (logp_it - old_logp_it) )      over policy tokens t

    and clips it at the sequence level, with bounds far tighter than PPO's (the
    paper uses 3e-4 below and 4e-4 above, the defaults here):

        loss_i = -min(s_i * A_i, clip(s_i, 1 - clip_low, 1 + clip_high) * A_i)

    so a sequence whose ratio leaves the band contributes no gradient at all.

    This is the paper's GSPO-token form: token t of sequence i uses
    s_it = sg(s_i) * pi(y_it) / sg(pi(y_it)), whose value is s_i and whose
    gradient is s_i * grad logp_it. With one advantage per sequence it equals
    GSPO in value and gradient; it also accepts per-token advantages ``[B, T]``.
    Every policy token of a sequence carries the same loss value, so the
    aggregation decides how sequences are weighted: "seq-mean-token-mean" is
    the paper's objective (mean over sequences), "token-mean" weights each
    sequence by its number of policy tokens, "seq-mean-token-sum" by that too
    but over the sequence count.

    Shapes as `ppo_clip_loss`. A sequence without policy tokens gets s = 1 and
    no loss. Stats (detached), over sequences with policy tokens:
      - ``seq_clip_frac_low``: fraction with s < 1 - clip_low and a negative
        (mean) advantage, ``seq_clip_frac_high``: s > 1 + clip_high and a
        positive one: the sequences the clip silences.
      - ``seq_ratio_mean``, ``seq_ratio_max``, ``seq_ratio_min``: of s.
    """
    if clip_low < 0 or clip_high < 0 or clip_low >= 1:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    advantages, valid, maskf, zeros = _per_token(logprobs, advantages, mask)
    tokens = maskf.sum(dim=-1, keepdim=True)
    log_ratio = torch.where(valid, logprobs - old_logprobs, zeros)
    seq_log_ratio = log_ratio.sum(dim=-1, keepdim=True) / tokens.clamp(min=1)  # [B, 1]
    # Value log s_i at every token, gradient d logp_t only (the token form's sg terms).
    own = torch.where(valid, logprobs - logprobs.detach(), zeros)
    ratio = torch.exp(seq_log_ratio.detach() + own)
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(-advantages * ratio, -advantages * clipped)
    loss = torch.where(valid, loss, zeros)

    with torch.no_grad():
        has = tokens[:, 0] > 0
        seqf = has.to(logprobs.dtype)
        s = seq_log_ratio[:, 0].exp()
        mean_adv = (advantages * maskf).sum(dim=-1) / tokens[:, 0].clamp(min=1)
        low = ((mean_adv < 0) & (s < 1.0 - clip_low)).to(seqf.dtype)
        high = ((mean_adv > 0) & (s > 1.0 + clip_high)).to(seqf.dtype)
        stats = {
            "seq_clip_frac_low": _masked_mean(low, seqf),
            "seq_clip_frac_high": _masked_mean(high, seqf),
            "seq_ratio_mean": _masked_mean(s, seqf),
            **_extremes(s, has, "seq_ratio"),
        }
    return loss, stats


def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 1.0,
    clip_high: float = 0.28,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped IS-weight Policy Optimization (MiniMax 2025, "MiniMax-M1", arXiv:2506.13585).

    PPO's clip zeroes the gradient of a token whose ratio left the band; CISPO
    clips the importance-sampling *weight* instead and keeps every token's
    policy gradient (a REINFORCE term):

        r_t    = exp(logp_t - old_logp_t)
        w_t    = sg(clip(r_t, max(0, 1 - clip_low), 1 + clip_high))
        loss_t = -w_t * A_t * logp_t

    so d loss_t / d logp_t = -w_t * A_t, which is non-zero for every policy
    token with A_t != 0, clipped or not. The report tunes only the upper bound
    and switches the lower one off by making it large, hence clip_low = 1 (a
    weight floor of 0) by default. It gives no value for the upper bound;
    0.28 is DAPO's clip-higher, used as CISPO's default elsewhere too.

    The loss value contains logp itself, so it is not on the scale of PPO's
    (only its gradient is meaningful). Shapes as `ppo_clip_loss`. Stats
    (detached), over policy tokens: ``cispo_clip_frac_low`` / ``_high`` (weight
    raised to the floor / cut at the cap), ``cispo_weight_mean``, and the
    unclipped ``ratio_mean``, ``ratio_max``, ``ratio_min``.
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip bounds must be >= 0, got low={clip_low}, high={clip_high}")
    advantages, valid, maskf, zeros = _per_token(logprobs, advantages, mask)
    floor, cap = max(0.0, 1.0 - clip_low), 1.0 + clip_high
    with torch.no_grad():
        ratio = torch.exp(torch.where(valid, logprobs - old_logprobs, zeros))
        weight = ratio.clamp(floor, cap)
    loss = torch.where(valid, -weight * advantages * logprobs, zeros)

    with torch.no_grad():
        stats = {
            "cispo_clip_frac_low": _masked_mean((ratio < floor).to(maskf.dtype), maskf),
            "cispo_clip_frac_high": _masked_mean((ratio > cap).to(maskf.dtype), maskf),
            "cispo_weight_mean": _masked_mean(weight, maskf),
            "ratio_mean": _masked_mean(ratio, maskf),
            **_extremes(ratio, valid, "ratio"),
        }
    return loss, stats
