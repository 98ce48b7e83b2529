"""Clipped policy-gradient loss and its aggregation over tokens and sequences."""

from __future__ import annotations

from typing import Literal, get_args

import torch

AggregationMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]


def _masked_mean(values: torch.Tensor, mask: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / count.clamp(min=1)


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO clipped surrogate loss, with clip-higher and optional dual clip.

    With ratio r = exp(logprobs - old_logprobs) and advantage A:

        loss = -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)
             = max(-r * A, -clip(r, ...) * A)

    PPO (Schulman et al. 2017) uses clip_low = clip_high = eps. Separate bounds are
    DAPO's "clip-higher" (Yu et al. 2025), e.g. clip_low=0.2, clip_high=0.28.
    Dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games"), with
    c = `dual_clip` > 1, bounds the objective from below for negative advantages:

        A < 0:  loss = min(loss, -c * A)

    so a token whose ratio has grown far beyond 1 cannot give an unbounded update.

    Shapes: `logprobs`, `old_logprobs` and `mask` are `[B, T]`; `advantages` is `[B]`
    (one per sequence, broadcast over its tokens) or `[B, T]`. `mask` is 1/True on
    policy tokens. The returned per-token loss is `[B, T]` with zeros where the mask is
    0 (the log-ratio there is set to 0 first, so garbage logprobs on padding cannot
    produce NaN gradients). Reduce it with `aggregate_loss`.

    Stats (detached 0-d tensors, no device sync), each over masked tokens only:
      - `clip_frac_low`: fraction with A < 0 and r < 1 - clip_low (the lower bound is
        active: the clipped term is chosen and the token's gradient is zero).
      - `clip_frac_high`: fraction with A > 0 and r > 1 + clip_high (the upper bound is
        active, same meaning).
      - `dual_clip_frac`: fraction with A < 0 where the dual-clip bound -c*A is the
        loss (0 when `dual_clip` is None).
      - `ratio_mean`, `ratio_max`, `ratio_min` (0 when the mask is empty).
    """
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip bounds must be >= 0, got low={clip_low}, high={clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    advantages = advantages.expand_as(logprobs)
    valid = mask.bool()
    maskf = valid.to(logprobs.dtype)

    log_ratio = torch.where(valid, logprobs - old_logprobs, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(-advantages * ratio, -advantages * clipped_ratio)

    dual_active = torch.zeros_like(valid)
    if dual_clip is not None:
        bound = -dual_clip * advantages
        dual_active = (advantages < 0) & (loss > bound)
        loss = torch.where(dual_active, bound, loss)
    loss = torch.where(valid, loss, torch.zeros_like(loss))

    with torch.no_grad():
        count = maskf.sum()
        r = ratio.detach()
        low = ((advantages < 0) & (r < 1.0 - clip_low)).to(maskf.dtype)
        high = ((advantages > 0) & (r > 1.0 + clip_high)).to(maskf.dtype)
        big = torch.finfo(r.dtype).max
        zero = r.new_zeros(())
        stats = {
            "clip_frac_low": _masked_mean(low, maskf, count),
            "clip_frac_high": _masked_mean(high, maskf, count),
            "dual_clip_frac": _masked_mean(dual_active.to(maskf.dtype), maskf, count),
            "ratio_mean": _masked_mean(r, maskf, count),
            "ratio_max": torch.where(count > 0, torch.where(valid, r, -big).max(), zero),
            "ratio_min": torch.where(count > 0, torch.where(valid, r, big).min(), zero),
        }
    return loss, stats


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: AggregationMode,
    total_tokens: float | int | torch.Tensor | None = None,
    total_seqs: float | int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a `[B, T]` per-token loss to a scalar over the masked tokens.

    With m the mask, L the per-token loss, and n_b = sum_t m_bt:

      - "token-mean":          sum_bt m_bt L_bt / N_tok        (DAPO, Yu et al. 2025)
      - "seq-mean-token-sum":  sum_b (sum_t m_bt L_bt) / N_seq
      - "seq-mean-token-mean": sum_b (sum_t m_bt L_bt / n_b) / N_seq   (GRPO, Shao et al. 2024)

    N_tok and N_seq default to this batch's counts: the number of masked tokens and
    the number of sequences with at least one masked token (sequences with none
    contribute nothing and are not counted). When a batch is split into
    micro-batches for gradient accumulation, pass the counts of the WHOLE batch as
    `total_tokens` and `total_seqs` (counted the same way); the sum of the
    micro-batch losses then equals the loss of the whole batch, and so do the
    gradients. Dr. GRPO's constant normaliser (Liu et al. 2025) is "token-mean" with
    `total_tokens` set to that constant.
    """
    maskf = mask.to(per_token_loss.dtype)
    masked = per_token_loss * maskf
    if mode == "token-mean":
        denom = maskf.sum() if total_tokens is None else total_tokens
        return masked.sum() / _positive(denom)
    tokens_per_seq = maskf.sum(dim=-1)
    if mode == "seq-mean-token-sum":
        seq_losses = masked.sum(dim=-1)
    elif mode == "seq-mean-token-mean":
        seq_losses = masked.sum(dim=-1) / tokens_per_seq.clamp(min=1)
    else:
        raise ValueError(
            f"unknown loss aggregation {mode!r}; expected one of {get_args(AggregationMode)}"
        )
    denom = (tokens_per_seq > 0).sum() if total_seqs is None else total_seqs
    return seq_losses.sum() / _positive(denom)


def _positive(denom: float | int | torch.Tensor) -> float | torch.Tensor:
    """Clamp a normaliser to at least 1 so an empty batch gives loss 0, not NaN."""
    if isinstance(denom, torch.Tensor):
        return denom.clamp(min=1)
    return max(float(denom), 1.0)
