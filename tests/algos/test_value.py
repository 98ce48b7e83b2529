"""GAE, turn-level GAE, the clipped value loss and explained variance, against values
worked out by hand."""

import math

import pytest
import torch

from fp32 import SAME_MATH
from temper.algos.value import explained_variance, gae, turn_gae, value_loss


def test_gae_by_hand():
    # gamma 0.9, lam 0.8, reward 1 at the last token:
    # t=2: delta = 1 - 0.8 = 0.2;                A = 0.2
    # t=1: delta = 0.9 * 0.8 - 0.6 = 0.12;       A = 0.12 + 0.72 * 0.2 = 0.264
    # t=0: delta = 0.9 * 0.6 - 0.5 = 0.04;       A = 0.04 + 0.72 * 0.264 = 0.23008
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.8]])
    adv, ret = gae(rewards, values, torch.ones(1, 3), gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, torch.tensor([[0.23008, 0.264, 0.2]]), **SAME_MATH)
    torch.testing.assert_close(ret, torch.tensor([[0.73008, 0.864, 1.0]]), **SAME_MATH)


def test_gae_steps_over_observation_tokens_and_padding():
    # Row 0 is the row above with an observation token (mask 0, value 9.9) after the
    # first token and two padding positions: the same advantages on the model's
    # tokens, 0 elsewhere. Row 1: gamma = lam = 1 gives reward-to-go minus value.
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 9.9, 0.6, 0.8, 3.0, 3.0], [1.0, 0.5, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv[0], torch.tensor([0.23008, 0, 0.264, 0.2, 0, 0]), **SAME_MATH)
    torch.testing.assert_close(ret[0], torch.tensor([0.73008, 0, 0.864, 1.0, 0, 0]), **SAME_MATH)
    adv1, _ = gae(rewards[1:], values[1:], mask[1:], gamma=1.0, lam=1.0)
    # t=1: 2 - 0.5 = 1.5; t=0: (0 + 0.5 - 1) + 1.5 = 1.0 = 2 - 1
    torch.testing.assert_close(adv1[0], torch.tensor([1.0, 1.5, 0, 0, 0, 0]), **SAME_MATH)


def test_gae_lambda_zero_is_one_step_td():
    rewards = torch.tensor([[0.0, 1.0]])
    values = torch.tensor([[0.3, 0.4]])
    adv, _ = gae(rewards, values, torch.ones(1, 2), gamma=1.0, lam=0.0)
    torch.testing.assert_close(adv, torch.tensor([[0.4 - 0.3, 1.0 - 0.4]]), **SAME_MATH)


def test_gae_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        gae(torch.zeros(1, 3), torch.zeros(1, 2), torch.ones(1, 3))


def test_turn_gae_by_hand():
    # Two turns, rewards 0.5 then 1.0, values 0.2 then 0.4, gamma 0.5, lam 1:
    # k=1: delta = 1.0 - 0.4 = 0.6;               A = 0.6, return 1.0
    # k=0: delta = 0.5 + 0.5 * 0.4 - 0.2 = 0.5;   A = 0.5 + 0.5 * 0.6 = 0.8, return 1.0
    # A second episode with one turn: A = 0.3 - 0.1.
    rewards = torch.tensor([[0.5, 1.0], [0.3, 0.0]])
    values = torch.tensor([[0.2, 0.4], [0.1, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    adv, ret = turn_gae(rewards, values, mask, gamma=0.5, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.8, 0.6], [0.2, 0.0]]), **SAME_MATH)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0], [0.3, 0.0]]), **SAME_MATH)


def test_value_loss_clipped_by_hand():
    # Token 0: V 1.0, old 0.5, R 2: unclipped (1-2)^2 = 1; clipped V = 0.7: 1.69. Max 1.69.
    # Token 1: V 0.0, old 0.5, R 0: unclipped 0; clipped V = 0.3: 0.09. Max 0.09.
    # Token 2: V 0.6, old 0.5, R 2: inside the clip, both 1.96.
    # Token 3: off the mask.
    values = torch.tensor([[1.0, 0.0, 0.6, 5.0]])
    old = torch.tensor([[0.5, 0.5, 0.5, 0.0]])
    ret = torch.tensor([[2.0, 0.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = value_loss(values, old, ret, mask, clip=0.2)
    torch.testing.assert_close(loss, torch.tensor([[0.845, 0.045, 0.98, 0.0]]), **SAME_MATH)
    assert stats["value_clip_frac"] == pytest.approx(2 / 3)
    plain, stats = value_loss(values, old, ret, mask, clip=None)
    torch.testing.assert_close(plain, torch.tensor([[0.5, 0.0, 0.98, 0.0]]), **SAME_MATH)
    assert stats["value_clip_frac"] == 0.0


def test_value_loss_gradient_stops_where_the_clip_binds():
    # Token 0's clipped term wins and is constant in V (V beyond old + clip): no gradient.
    values = torch.tensor([[1.0, 0.6]], requires_grad=True)
    loss, _ = value_loss(values, torch.tensor([[0.5, 0.5]]), torch.tensor([[2.0, 2.0]]),
                         torch.ones(1, 2), clip=0.2)  # fmt: skip
    loss.sum().backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 0.6 - 2.0]]), **SAME_MATH)


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.tensor([[1, 1, 1, 1]])
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.5), returns, mask) == pytest.approx(0.0)
    # V = R - [0, 1, 0, 1]: Var(R - V) / Var(R) = (1/3) / (5/3) = 0.2
    assert explained_variance(returns - torch.tensor([[0, 1, 0, 1.0]]), returns, mask) == (
        pytest.approx(1 - 0.2)
    )
    assert math.isnan(explained_variance(returns, torch.ones(1, 4), mask))
