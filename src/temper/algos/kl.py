"""Per-token estimators of KL(pi || pi_ref) from samples of the policy."""

from __future__ import annotations

from typing import Literal, get_args

import torch

KLKind = Literal["k1", "k2", "k3"]


def kl_estimate(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    kind: KLKind = "k3",
    max_log_ratio: float | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) for tokens sampled from the policy pi.

    From Schulman 2020, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html).
    With r = pi_ref(x) / pi(x), i.e. log r = ref_logprobs - logprobs, and x ~ pi:

      - k1 = -log r = log pi - log pi_ref         unbiased, high variance, can be < 0
      - k2 = 1/2 (log r)^2                        biased (low for close policies), >= 0
      - k3 = r - 1 - log r                        unbiased, >= 0, low variance (used by GRPO)

    Each is a per-token tensor of the inputs' shape; average it over masked tokens
    (e.g. with `aggregate_loss`) for the batch KL. `max_log_ratio`, when set, clamps
    log r to [-max_log_ratio, max_log_ratio] first, keeping k3's exp finite when the
    two policies disagree sharply on a token.
    """
    log_r = ref_logprobs - logprobs
    if max_log_ratio is not None:
        log_r = log_r.clamp(min=-max_log_ratio, max=max_log_ratio)
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r.square()
    if kind == "k3":
        return torch.exp(log_r) - 1.0 - log_r
    raise ValueError(f"unknown KL estimator {kind!r}; expected one of {get_args(KLKind)}")
