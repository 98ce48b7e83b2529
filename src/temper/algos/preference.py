"""Preference losses on sequence log-probabilities: DPO (with cDPO's label smoothing) and IPO.

Every input is one number per pair, ``[P]``: the summed log-probability of the
chosen (``c``) or rejected (``r``) response's policy tokens under the policy
being trained (``pi_*``) or under the frozen reference (``ref_*``). With

    h = (pi_c - ref_c) - (pi_r - ref_r)          the log-ratio margin of the pair

- DPO (Rafailov et al. 2023, "Direct Preference Optimization", arXiv:2305.18290),
  the sigmoid loss of a Bradley-Terry model whose reward is ``beta * (pi - ref)``:

      loss = -log sigmoid(beta * h)

  With label smoothing ``eps`` (conservative DPO, Mitchell 2023, "A note on DPO
  with noisy preferences"; TRL's ``label_smoothing``): a pair's label is taken as
  flipped with probability ``eps``,

      loss = -(1 - eps) * log sigmoid(beta * h) - eps * log sigmoid(-beta * h)

- IPO (Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning
  from Human Preferences", arXiv:2310.12036): a squared loss that pulls the margin
  to ``1 / (2 * beta)`` instead of pushing it without bound,

      loss = (h - 1 / (2 * beta)) ** 2

  Here on sequence sums, as the paper writes it; TRL's ``ipo`` divides each
  sequence's log-probability by its length first.

`preference_stats` gives what TRL and OpenRLHF log: the implicit rewards
``beta * (pi - ref)`` of chosen and rejected, their margin, the share of pairs
whose chosen reward is strictly above the rejected one, and a KL estimate.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
import torch.nn.functional as F

PreferenceLossName = Literal["sigmoid", "ipo"]


def log_ratio_margin(
    pi_c: torch.Tensor, pi_r: torch.Tensor, ref_c: torch.Tensor, ref_r: torch.Tensor
) -> torch.Tensor:
    """``h = (pi_c - ref_c) - (pi_r - ref_r)`` per pair ``[P]``."""
    return (pi_c - ref_c) - (pi_r - ref_r)


def dpo_loss(
    pi_c: torch.Tensor,
    pi_r: torch.Tensor,
    ref_c: torch.Tensor,
    ref_r: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """DPO's per-pair loss ``[P]`` (cDPO's when ``label_smoothing > 0``); see the module."""
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    logits = beta * log_ratio_margin(pi_c, pi_r, ref_c, ref_r)
    # logsigmoid is stable for large |logits|, where log(sigmoid(x)) would underflow to -inf.
    loss = -F.logsigmoid(logits)
    if label_smoothing:
        loss = (1.0 - label_smoothing) * loss - label_smoothing * F.logsigmoid(-logits)
    return loss


def ipo_loss(
    pi_c: torch.Tensor,
    pi_r: torch.Tensor,
    ref_c: torch.Tensor,
    ref_r: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """IPO's per-pair loss ``[P]``: ``(h - 1/(2 beta))^2``; see the module."""
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    return (log_ratio_margin(pi_c, pi_r, ref_c, ref_r) - 1.0 / (2.0 * beta)).square()


def preference_loss(
    kind: PreferenceLossName,
    pi_c: torch.Tensor,
    pi_r: torch.Tensor,
    ref_c: torch.Tensor,
    ref_r: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """The per-pair loss ``[P]`` of ``kind`` ("sigmoid": DPO, "ipo": IPO)."""
    if kind == "sigmoid":
        return dpo_loss(pi_c, pi_r, ref_c, ref_r, beta, label_smoothing)
    if kind == "ipo":
        if label_smoothing:
            raise ValueError("label_smoothing applies to the sigmoid (DPO) loss only")
        return ipo_loss(pi_c, pi_r, ref_c, ref_r, beta)
    raise ValueError(
        f"unknown preference loss {kind!r}; expected one of {get_args(PreferenceLossName)}"
    )


def preference_stats(
    pi_c: torch.Tensor,
    pi_r: torch.Tensor,
    ref_c: torch.Tensor,
    ref_r: torch.Tensor,
    beta: float,
    chosen_tokens: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Detached 0-d stats of a batch of pairs (means over pairs unless said otherwise):

    - ``rewards_chosen``: ``beta * (pi_c - ref_c)``; ``rewards_rejected`` likewise;
    - ``margin``: rewards_chosen - rewards_rejected (= ``beta * h``);
    - ``reward_accuracy``: the share of pairs with rewards_chosen > rewards_rejected
      (strictly: at the reference itself every reward is 0 and the share is 0);
    - ``kl``: ``pi_c - ref_c`` per token of the chosen responses, i.e. the sum over
      pairs divided by ``chosen_tokens.sum()`` (per sequence when ``chosen_tokens``
      is None). It is k1, an unbiased estimate of KL(pi || ref) only when the chosen
      responses were sampled from pi (online pairs); on a dataset's responses it is
      the log-ratio the policy has moved on them.
    """
    with torch.no_grad():
        rc = beta * (pi_c - ref_c).detach()
        rr = beta * (pi_r - ref_r).detach()
        log_ratio = (pi_c - ref_c).detach()
        if chosen_tokens is None:
            kl = log_ratio.mean() if log_ratio.numel() else log_ratio.new_zeros(())
        else:
            kl = log_ratio.sum() / chosen_tokens.to(log_ratio.dtype).sum().clamp(min=1)
        return {
            "rewards_chosen": rc.mean(),
            "rewards_rejected": rr.mean(),
            "margin": (rc - rr).mean(),
            "reward_accuracy": (rc > rr).to(rc.dtype).mean(),
            "kl": kl,
        }
