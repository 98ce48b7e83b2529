"""What a policy step logs: micro-batch statistics summed into one step's metrics.

`PolicyTrainer` adds each micro-batch's objective and importance-ratio stats to a
running sum (`accumulate_ratio_stats`); after the optimizer step the sums become
``name -> (value, weight)`` pairs (`rl_step_stats`, `sft_step_stats`), which
the step then averages over its mini-batches by weight.
"""

from __future__ import annotations

#: Objective and importance-ratio statistics logged each step, when the objective
#: gives them: means weighted by policy tokens, means weighted by sequences, maxima.
_RATIO_MEANS = (
    "clip_frac_low",
    "clip_frac_high",
    "ratio_mean",
    "cispo_clip_frac_low",
    "cispo_clip_frac_high",
    "cispo_weight_mean",
    "is_ratio_mean",
    "is_weight_mean",
    "is_log_ratio_abs_mean",
    "is_truncated_frac",
    "is_masked_frac",
)
_SEQ_MEANS = ("seq_clip_frac_low", "seq_clip_frac_high", "seq_ratio_mean")
_RATIO_MAXES = ("ratio_max", "is_ratio_max", "seq_ratio_max")


def accumulate_ratio_stats(acc: dict[str, float], stats: dict, n_tok: float, n_seq: float) -> None:
    """Add a micro-batch's ratio stats to ``acc`` (means weighted by its tokens or
    sequences with policy tokens; the sequence count goes to ``acc["stat_seqs"]``)."""
    if not n_tok:
        return
    for key in _RATIO_MEANS:
        if key in stats:
            acc[key] += float(stats[key]) * n_tok
    if any(key in stats for key in _SEQ_MEANS):
        acc["stat_seqs"] += n_seq
    for key in _SEQ_MEANS:
        if key in stats:
            acc[key] += float(stats[key]) * n_seq
    for key in _RATIO_MAXES:
        if key in stats:
            acc[key] = max(acc.get(key, 0.0), float(stats[key]))


def rl_step_stats(
    acc: dict[str, float], total_tokens: float, grad_norm: float, lr: float, kl_logged: bool
) -> dict[str, tuple[float, float]]:
    """An RL step's stats from its summed micro-batch stats ``acc``: name -> (value,
    weight), means weighted by policy tokens or sequences; ``kl`` when a KL penalty ran."""
    w = max(total_tokens, 1.0)
    stats: dict[str, tuple[float, float]] = {
        "loss": (acc["loss"], 1.0),
        "grad_norm": (grad_norm, 1.0),
        "lr": (lr, 1.0),
        "entropy": (acc["entropy"] / w, w),
        "train_infer_logprob_diff": (acc["mismatch_abs"] / w, w),
        "train_infer_logprob_diff_max": (acc["mismatch_max"], 1.0),
    }
    for key in _RATIO_MEANS:
        if key in acc:
            stats[key] = (acc[key] / w, w)
    seqs = acc.get("stat_seqs", 0.0)
    for key in _SEQ_MEANS:
        if key in acc and seqs > 0:
            stats[key] = (acc[key] / seqs, seqs)
    for key in _RATIO_MAXES:
        if key in acc:
            stats[key] = (acc[key], 1.0)
    if kl_logged:
        stats["kl"] = (acc["kl"] / w, w)
    if "distill_full_kl" in acc:  # distill.estimator = "full": the exact KL it minimised
        stats["distill_full_kl"] = (acc["distill_full_kl"] / w, w)
    stats["train_tokens"] = (total_tokens, 1.0)
    return stats


def sft_step_stats(
    acc: dict[str, float], total_tokens: float, grad_norm: float, lr: float
) -> dict[str, tuple[float, float]]:
    """A supervised step's stats: its loss is the NLL per token, weighted by tokens."""
    w = max(total_tokens, 1.0)
    return {
        "loss": (acc["loss"], w),
        "nll_per_token": (acc["loss"], w),
        "grad_norm": (grad_norm, 1.0),
        "lr": (lr, 1.0),
        "train_tokens": (total_tokens, 1.0),
    }
