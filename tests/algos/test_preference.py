"""DPO (with cDPO's label smoothing) and IPO losses and their stats against hand-computed values."""

import math

import pytest
import torch

from temper.algos.preference import dpo_loss, ipo_loss, preference_loss, preference_stats

# Two pairs, beta = 0.5.
# Pair 0: h = (-1.0 + 1.5) - (-2.0 + 1.0) = 0.5 + 1.0 = 1.5   -> beta h = 0.75
# Pair 1: h = (-3.0 + 2.0) - (-1.5 + 2.5) = -1.0 - 1.0 = -2.0 -> beta h = -1.0
PI_C, PI_R = [-1.0, -3.0], [-2.0, -1.5]
REF_C, REF_R = [-1.5, -2.0], [-1.0, -2.5]
BETA = 0.5
FP32 = {"rel": 1e-6, "abs": 1e-6}


def _t(values, grad=False):
    return torch.tensor(values, dtype=torch.float32, requires_grad=grad)


def _softplus(x):
    return math.log1p(math.exp(x))  # -log sigmoid(-x)


def test_dpo_sigmoid_loss_and_gradient_by_hand():
    pi_c, pi_r = _t(PI_C, grad=True), _t(PI_R, grad=True)
    loss = dpo_loss(pi_c, pi_r, _t(REF_C), _t(REF_R), BETA)
    # -log sigmoid(z) = log(1 + e^-z)
    assert loss.tolist() == pytest.approx([_softplus(-0.75), _softplus(1.0)], **FP32)
    loss.sum().backward()
    # d/d pi_c of -log sigmoid(beta h) = -beta sigmoid(-beta h); pi_r gets the opposite.
    expected = [-BETA / (1 + math.exp(0.75)), -BETA / (1 + math.exp(-1.0))]
    assert pi_c.grad.tolist() == pytest.approx(expected, **FP32)
    assert pi_r.grad.tolist() == pytest.approx([-g for g in expected], **FP32)


def test_label_smoothing_is_cdpo():
    eps = 0.1
    loss = dpo_loss(_t(PI_C), _t(PI_R), _t(REF_C), _t(REF_R), BETA, label_smoothing=eps)
    # (1 - eps) (-log sigmoid(z)) + eps (-log sigmoid(-z))
    expected = [
        (1 - eps) * _softplus(-0.75) + eps * _softplus(0.75),
        (1 - eps) * _softplus(1.0) + eps * _softplus(-1.0),
    ]
    assert loss.tolist() == pytest.approx(expected, **FP32)
    plain = preference_loss("sigmoid", _t(PI_C), _t(PI_R), _t(REF_C), _t(REF_R), BETA)
    assert plain.tolist() == pytest.approx([_softplus(-0.75), _softplus(1.0)], **FP32)


def test_ipo_loss_and_gradient_by_hand():
    pi_c = _t(PI_C, grad=True)
    loss = ipo_loss(pi_c, _t(PI_R), _t(REF_C), _t(REF_R), BETA)
    # (h - 1 / (2 beta))^2 with 1 / (2 * 0.5) = 1: (1.5 - 1)^2, (-2 - 1)^2
    assert loss.tolist() == pytest.approx([0.25, 9.0], **FP32)
    loss.sum().backward()
    assert pi_c.grad.tolist() == pytest.approx([2 * 0.5, 2 * -3.0], **FP32)
    same = preference_loss("ipo", _t(PI_C), _t(PI_R), _t(REF_C), _t(REF_R), BETA)
    assert same.tolist() == pytest.approx([0.25, 9.0], **FP32)


def test_ipo_minimum_is_at_the_target_margin():
    beta = 0.25  # target margin 1 / (2 beta) = 2
    loss = ipo_loss(_t([0.0]), _t([-2.0]), _t([0.0]), _t([0.0]), beta)
    assert loss.item() == 0.0


def test_dpo_is_finite_far_from_the_reference():
    # beta h = -200: log(sigmoid) would underflow to -inf; logsigmoid keeps it at 200.
    loss = dpo_loss(_t([-400.0]), _t([0.0]), _t([0.0]), _t([0.0]), BETA)
    assert loss.item() == pytest.approx(200.0, rel=1e-6)


def test_stats_by_hand():
    tokens = _t([2.0, 3.0])
    stats = preference_stats(_t(PI_C), _t(PI_R), _t(REF_C), _t(REF_R), BETA, tokens)
    # rewards chosen: 0.5 * 0.5 = 0.25, 0.5 * -1.0 = -0.5; rejected: 0.5 * -1.0, 0.5 * 1.0
    assert stats["rewards_chosen"].item() == pytest.approx(-0.125, **FP32)
    assert stats["rewards_rejected"].item() == pytest.approx(0.0, **FP32)
    assert stats["margin"].item() == pytest.approx((0.75 - 1.0) / 2, **FP32)
    assert stats["reward_accuracy"].item() == 0.5  # pair 0 only
    # KL per chosen token: (0.5 + -1.0) / (2 + 3); per sequence: -0.5 / 2
    assert stats["kl"].item() == pytest.approx(-0.1, **FP32)
    per_seq = preference_stats(_t(PI_C), _t(PI_R), _t(REF_C), _t(REF_R), BETA)
    assert per_seq["kl"].item() == pytest.approx(-0.25, **FP32)


def test_at_the_reference_every_reward_is_zero_and_no_pair_counts_as_preferred():
    x = _t([-1.0, -2.0])
    stats = preference_stats(x, x, x, x, BETA)
    assert stats["reward_accuracy"].item() == 0.0 and stats["margin"].item() == 0.0
    assert dpo_loss(x, x, x, x, BETA).tolist() == pytest.approx([math.log(2)] * 2, **FP32)


@pytest.mark.parametrize("beta", [0.0, -0.1])
def test_beta_must_be_positive(beta):
    with pytest.raises(ValueError, match="beta must be > 0"):
        dpo_loss(_t([0.0]), _t([0.0]), _t([0.0]), _t([0.0]), beta)
    with pytest.raises(ValueError, match="beta must be > 0"):
        ipo_loss(_t([0.0]), _t([0.0]), _t([0.0]), _t([0.0]), beta)


def test_label_smoothing_is_refused_for_ipo_and_out_of_range():
    args = (_t([0.0]), _t([0.0]), _t([0.0]), _t([0.0]), BETA)
    with pytest.raises(ValueError, match="sigmoid"):
        preference_loss("ipo", *args, label_smoothing=0.1)
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(*args, label_smoothing=0.5)
