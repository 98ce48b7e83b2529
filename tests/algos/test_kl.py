"""KL estimators against hand-computed values."""

import math

import pytest
import torch

from temper.algos import kl_estimate

LN2 = math.log(2.0)


def test_kl_estimators_hand_values():
    # token 0: pi = 0.5, pi_ref = 0.25 -> log r = -ln 2, r = 0.5
    # token 1: pi = 0.25, pi_ref = 0.5 -> log r = ln 2, r = 2
    logp = torch.log(torch.tensor([0.5, 0.25]))
    ref = torch.log(torch.tensor([0.25, 0.5]))
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), torch.tensor([LN2, -LN2]))
    torch.testing.assert_close(kl_estimate(logp, ref, "k2"), torch.tensor([0.5 * LN2**2] * 2))
    # k3 = r - 1 - log r: 0.5 - 1 + ln2 = 0.193147; 2 - 1 - ln2 = 0.306853
    torch.testing.assert_close(kl_estimate(logp, ref, "k3"), torch.tensor([LN2 - 0.5, 1.0 - LN2]))


def test_identical_policies_give_zero():
    logp = torch.log(torch.tensor([0.3, 0.7]))
    for kind in ("k1", "k2", "k3"):
        torch.testing.assert_close(kl_estimate(logp, logp, kind), torch.zeros(2))


def test_k1_and_k3_are_unbiased_for_kl_pi_ref():
    # exact expectation over x ~ pi of a 3-way categorical
    pi = torch.tensor([0.5, 0.25, 0.25])
    ref = torch.tensor([0.25, 0.5, 0.25])
    kl = 0.5 * LN2 + 0.25 * math.log(0.5)  # = 0.25 ln 2
    for kind in ("k1", "k3"):
        expectation = (pi * kl_estimate(pi.log(), ref.log(), kind)).sum()
        torch.testing.assert_close(expectation, torch.tensor(kl))


def test_clamp_and_unknown_kind():
    out = kl_estimate(torch.tensor([0.0]), torch.tensor([100.0]), "k3", max_log_ratio=1.0)
    torch.testing.assert_close(out, torch.tensor([math.e - 2.0]))
    with pytest.raises(ValueError, match="unknown KL"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")  # type: ignore[arg-type]
