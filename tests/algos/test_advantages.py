"""Advantage estimators against hand-computed values."""

import math

import pytest
import torch

from temper.algos import (
    compute_advantages,
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)

REWARDS = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]])


def test_grpo_divides_by_unbiased_group_std():
    # group 1: mean 2, std sqrt((1+0+1)/2) = 1; group 2: mean 4, std sqrt((4+0+4)/2) = 2
    expected = torch.tensor([[-1.0, 0.0, 1.0], [-1.0, 0.0, 1.0]])
    torch.testing.assert_close(grpo_advantages(REWARDS, eps=0.0), expected)
    torch.testing.assert_close(grpo_advantages(REWARDS), expected, atol=1e-5, rtol=0)


def test_grpo_constant_group_and_no_std():
    rewards = torch.tensor([[5.0, 5.0, 5.0], [0.0, 1.0, 2.0]])
    out = grpo_advantages(rewards)
    torch.testing.assert_close(out[0], torch.zeros(3))
    no_std = grpo_advantages(rewards, scale_by_std=False)
    torch.testing.assert_close(no_std, torch.tensor([[0.0, 0.0, 0.0], [-1.0, 0.0, 1.0]]))


def test_grpo_group_of_one_is_zero_and_ints_accepted():
    torch.testing.assert_close(grpo_advantages(torch.tensor([[3], [7]])), torch.zeros(2, 1))


def test_dr_grpo_subtracts_group_mean():
    rewards = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 9.0]])  # means 2 and 5
    expected = torch.tensor([[-1.0, 0.0, 1.0], [-3.0, -1.0, 4.0]])
    torch.testing.assert_close(dr_grpo_advantages(rewards), expected)


def test_rloo_leaves_one_out():
    rewards = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 9.0]])
    # 1 - (2+3)/2 = -1.5, 2 - (1+3)/2 = 0, 3 - (1+2)/2 = 1.5
    # 2 - (4+9)/2 = -4.5, 4 - (2+9)/2 = -1.5, 9 - (2+4)/2 = 6
    expected = torch.tensor([[-1.5, 0.0, 1.5], [-4.5, -1.5, 6.0]])
    torch.testing.assert_close(rloo_advantages(rewards), expected)


def test_rloo_needs_two():
    with pytest.raises(ValueError, match="at least 2"):
        rloo_advantages(torch.tensor([[1.0], [2.0]]))


def test_reinforce_pp_baseline_uses_batch_std():
    # centered: [-1, 0, 1], [-2, 0, 2]; batch std = sqrt((1+1+4+4)/5) = sqrt(2)
    s = 1 / math.sqrt(2)
    expected = torch.tensor([[-s, 0.0, s], [-2 * s, 0.0, 2 * s]])
    torch.testing.assert_close(reinforce_pp_baseline_advantages(REWARDS, eps=0.0), expected)


def test_dispatcher():
    torch.testing.assert_close(compute_advantages("grpo", REWARDS), grpo_advantages(REWARDS))
    centered = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0]])
    torch.testing.assert_close(compute_advantages("grpo_no_std", REWARDS), centered)
    torch.testing.assert_close(compute_advantages("dr_grpo", REWARDS), centered)
    torch.testing.assert_close(compute_advantages("rloo", REWARDS), 1.5 * centered)
    torch.testing.assert_close(
        compute_advantages("reinforce_pp_baseline", REWARDS),
        reinforce_pp_baseline_advantages(REWARDS),
    )
    with pytest.raises(ValueError, match="unknown advantage"):
        compute_advantages("ppo", REWARDS)  # type: ignore[arg-type]


def test_rejects_flat_rewards():
    with pytest.raises(ValueError, match="num_groups, group_size"):
        grpo_advantages(torch.tensor([1.0, 2.0]))
