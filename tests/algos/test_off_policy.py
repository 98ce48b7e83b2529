"""Importance-sampling corrections against hand-computed values."""

import math

import pytest
import torch

from temper.algos.off_policy import importance_weights

LN2 = math.log(2.0)


def _inputs():
    # Row 0: rho = 2, 0.5, 4 (log-ratios ln2, -ln2, 2 ln2); row 1: rho = 1, then padding.
    prox = torch.tensor([[LN2, -LN2, 2 * LN2], [0.3, 9.0, 9.0]])
    behaviour = torch.tensor([[0.0, 0.0, 0.0], [0.3, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    return prox, behaviour, mask


def test_none_and_behaviour_give_no_weights_but_ratio_stats():
    prox, behaviour, mask = _inputs()
    for correction in ("none", "behaviour"):
        weights, stats = importance_weights(prox, behaviour, mask, correction)
        assert weights is None
        assert stats["is_ratio_max"].item() == pytest.approx(4.0)
        assert stats["is_ratio_min"].item() == pytest.approx(0.5)
        assert stats["is_ratio_mean"].item() == pytest.approx((2 + 0.5 + 4 + 1) / 4)
        assert stats["is_log_ratio_abs_mean"].item() == pytest.approx(4 * LN2 / 4)


def test_tis_token_truncates_at_cap():
    prox, behaviour, mask = _inputs()
    weights, stats = importance_weights(prox, behaviour, mask, "tis", cap=2.0)
    expected = torch.tensor([[2.0, 0.5, 2.0], [1.0, 0.0, 0.0]])
    assert torch.allclose(weights, expected)
    assert stats["is_truncated_frac"].item() == pytest.approx(1 / 4)
    assert stats["is_weight_mean"].item() == pytest.approx(5.5 / 4)


def test_mis_token_masks_outside_band():
    prox, behaviour, mask = _inputs()
    weights, stats = importance_weights(prox, behaviour, mask, "mis", cap=2.0, low=0.6)
    # 0.5 < low and 4 > cap are masked; 2 and 1 are kept with their ratio.
    expected = torch.tensor([[2.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    assert torch.allclose(weights, expected)
    assert stats["is_masked_frac"].item() == pytest.approx(2 / 4)


def test_sequence_level_uses_the_product_of_ratios():
    prox, behaviour, mask = _inputs()
    # Row 0: 2 * 0.5 * 4 = 4 -> truncated to 3; row 1: 1 (padding ignored).
    weights, _ = importance_weights(prox, behaviour, mask, "tis", level="sequence", cap=3.0)
    assert torch.allclose(weights, torch.tensor([[3.0, 3.0, 3.0], [1.0, 0.0, 0.0]]))
    weights, stats = importance_weights(prox, behaviour, mask, "mis", level="sequence", cap=3.0)
    assert torch.allclose(weights, torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    assert stats["is_masked_frac"].item() == pytest.approx(3 / 4)


def test_decoupled_is_the_untruncated_token_ratio():
    prox, behaviour, mask = _inputs()
    weights, stats = importance_weights(prox, behaviour, mask, "decoupled", cap=2.0)
    assert torch.allclose(weights, torch.tensor([[2.0, 0.5, 4.0], [1.0, 0.0, 0.0]]))
    assert stats["is_weight_mean"].item() == pytest.approx(7.5 / 4)


def test_weights_carry_no_gradient_and_huge_ratios_stay_finite():
    prox = torch.tensor([[500.0, 500.0]], requires_grad=True)
    behaviour = torch.zeros(1, 2)
    weights, _ = importance_weights(prox, behaviour, torch.ones(1, 2), "decoupled")
    assert not weights.requires_grad
    assert torch.isfinite(weights).all()
    weights, _ = importance_weights(prox, behaviour, torch.ones(1, 2), "mis", level="sequence")
    assert weights.sum().item() == 0.0


def test_bad_bounds_raise():
    prox, behaviour, mask = _inputs()
    with pytest.raises(ValueError, match="low < cap"):
        importance_weights(prox, behaviour, mask, "mis", cap=1.0, low=2.0)
    with pytest.raises(ValueError, match="unknown off-policy correction"):
        importance_weights(prox, behaviour, mask, "bogus")  # type: ignore[arg-type]
