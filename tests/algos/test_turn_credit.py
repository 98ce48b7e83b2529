"""Turn-level credit against hand-computed returns and advantages."""

import math

import pytest

from temper.algos.turn_credit import (
    episode_turn_rewards,
    token_advantages,
    turn_advantages,
    turn_returns,
)


def test_returns_are_discounted_rewards_to_go():
    # G_2 = 2, G_1 = 0 + 0.5 * 2 = 1, G_0 = 1 + 0.5 * 1 = 1.5
    assert turn_returns([1.0, 0.0, 2.0], gamma=0.5) == [1.5, 1.0, 2.0]
    assert turn_returns([1.0, 0.0, 2.0], gamma=1.0) == [3.0, 2.0, 2.0]
    assert turn_returns([1.0, 0.0, 2.0], gamma=0.0) == [1.0, 0.0, 2.0]
    assert turn_returns([]) == []


def test_outcome_beyond_the_env_rewards_lands_on_the_last_turn_once():
    # add_reward's 0.5 is on top of the env's 0.1 + 0.2; the third turn was never stepped.
    assert episode_turn_rewards([0.1, 0.2], 3, 0.8) == pytest.approx([0.1, 0.2, 0.5])
    # An env that pays its outcome in the last turn reward (the games): nothing added.
    assert episode_turn_rewards([0.1, 1.2], 2, 1.3) == pytest.approx([0.1, 1.2])
    # A reward the env never saw (no steps at all): the single turn holds it.
    assert episode_turn_rewards([], 0, 1.0) == [1.0]


# One group, three episodes of 2, 1 and 3 turns: returns per turn index.
RETURNS = [[[3.0, 1.0], [1.0], [2.0, 3.0, 1.0]]]


def test_baseline_is_per_turn_index_over_the_episodes_that_reached_it():
    # index 0: mean of 3, 1, 2 = 2; index 1: mean of 1, 3 = 2; index 2: one episode -> 0.
    assert turn_advantages(RETURNS, "dr_grpo") == [[[1.0, -1.0], [-1.0], [0.0, 1.0, 0.0]]]
    assert turn_advantages(RETURNS, "grpo_no_std") == turn_advantages(RETURNS, "dr_grpo")


def test_grpo_divides_by_the_unbiased_std_at_each_index():
    # index 0: std(3, 1, 2) = 1; index 1: std(1, 3) = sqrt(2).
    s = math.sqrt(2)
    expected = [[[1.0, -1 / s], [-1.0], [0.0, 1 / s, 0.0]]]
    got = turn_advantages(RETURNS, "grpo", eps=0.0)
    assert got == [[pytest.approx(e) for e in g] for g in expected]


def test_rloo_leaves_the_episode_out_of_its_turn_baseline():
    # index 0: 3 - (1+2)/2 = 1.5, 1 - (3+2)/2 = -1.5, 2 - (3+1)/2 = 0; index 1: 1 - 3, 3 - 1.
    assert turn_advantages(RETURNS, "rloo") == [[[1.5, -2.0], [-1.5], [0.0, 2.0, 0.0]]]


def test_reinforce_pp_baseline_scales_by_one_batch_std():
    # Centred values 1, -1, -1, 0, 1, 0: sum of squares 4 over n - 1 = 5.
    scale = math.sqrt(4 / 5)
    got = turn_advantages(RETURNS, "reinforce_pp_baseline", eps=0.0)
    expected = [[1 / scale, -1 / scale], [-1 / scale], [0.0, 1 / scale, 0.0]]
    assert got == [[pytest.approx(e) for e in expected]]


def test_groups_get_their_own_baselines_and_unknown_estimators_are_refused():
    got = turn_advantages([[[1.0], [3.0]], [[10.0], [30.0]]], "dr_grpo")
    assert got == [[[-1.0], [1.0]], [[-10.0], [10.0]]]
    with pytest.raises(ValueError, match="no form for advantage estimator 'ppo'"):
        turn_advantages(RETURNS, "ppo")


def test_every_token_of_a_turn_gets_its_advantage_and_observations_zero():
    assert token_advantages([2.0, -1.0], [(0, 3), (5, 7)], 8) == [2, 2, 2, 0, 0, -1, -1, 0]
    assert token_advantages([0.5], [], 3) == [0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match="1 turn advantages for 2 turn spans"):
        token_advantages([1.0], [(0, 1), (2, 3)], 3)
