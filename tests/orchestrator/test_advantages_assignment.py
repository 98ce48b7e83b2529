import json
import math

import pytest

from temper.orchestrator.advantages import assign_advantages
from temper.records import Trajectory


def _t(group, reward):
    return Trajectory(
        task_id=f"t{group}",
        group_id=group,
        prompt_ids=[1],
        response_ids=[2],
        loss_mask=[1],
        behaviour_logprobs=[0.0],
        versions=[0],
        finish_reason="stop",
        reward=reward,
    )


def test_zero_variance_groups_are_dropped_and_advantages_set():
    groups = [[_t(0, 1.0), _t(0, 0.0)], [_t(1, 1.0), _t(1, 1.0)]]
    kept, dropped = assign_advantages(groups, "dr_grpo", drop_zero_variance=True)
    assert dropped == 1
    assert [t.advantage for t in kept] == [0.5, -0.5]


def test_zero_variance_groups_kept_when_asked():
    groups = [[_t(0, 1.0), _t(0, 1.0)]]
    kept, dropped = assign_advantages(groups, "dr_grpo", drop_zero_variance=False)
    assert dropped == 0 and [t.advantage for t in kept] == [0.0, 0.0]


def test_nan_rewards_are_removed_before_advantages():
    groups = [[_t(0, 1.0), _t(0, 0.0), _t(0, math.nan)]]
    kept, _ = assign_advantages(groups, "dr_grpo", drop_zero_variance=True)
    assert len(kept) == 2 and [t.advantage for t in kept] == [0.5, -0.5]


def _episode(turn_rewards, spans, length, reward=None):
    """A multi-turn trajectory: turns at ``spans`` of ``length`` response tokens."""
    mask = [0] * length
    for start, end in spans:
        mask[start:end] = [1] * (end - start)
    return Trajectory(
        task_id="game",
        group_id=0,
        prompt_ids=[1],
        response_ids=[5] * length,
        loss_mask=mask,
        behaviour_logprobs=[0.0] * length,
        versions=[0] * length,
        finish_reason="done",
        reward=sum(turn_rewards) if reward is None else reward,
        num_turns=len(spans),
        turn_spans=spans,
        turn_rewards=turn_rewards,
    )


def test_turn_credit_gives_each_turn_its_return_against_the_same_turn_index():
    # Episode a: turns rewarded 1 then 0 (returns 1, 0); b: 0 then 1 (returns 1, 1);
    # c: one turn rewarded 0, plus 1.0 from add_reward on top (return 1). Every
    # episode's reward is 1, so outcome credit gives them all 0.
    a = _episode([1.0, 0.0], [(0, 2), (4, 6)], 7)
    b = _episode([0.0, 1.0], [(0, 1), (3, 5)], 5)
    c = _episode([0.0], [(0, 3)], 3, reward=1.0)
    kept, dropped = assign_advantages([[a, b, c]], "dr_grpo", False, "turn", 1.0)
    # index 0: all returns 1 -> 0; index 1: a 0, b 1 (mean 0.5) -> -0.5, +0.5.
    assert dropped == 0 and len(kept) == 3
    assert a.token_advantages == [0, 0, 0, 0, -0.5, -0.5, 0]
    assert b.token_advantages == [0, 0, 0, 0.5, 0.5]
    assert c.token_advantages == [0, 0, 0]
    # Discounted (gamma 0.5): a's returns 1, 0; b's 0.5, 1; c's 1 -> index 0 mean 5/6.
    assign_advantages([[a, b, c]], "dr_grpo", False, "turn", 0.5)
    assert a.token_advantages[:2] == pytest.approx([1 / 6] * 2)
    assert b.token_advantages[0] == pytest.approx(-1 / 3)
    assert a.advantage == pytest.approx(1 / 6)  # turn 0's, for logs
    # Outcome credit clears them again.
    assign_advantages([[a, b, c]], "dr_grpo", False)
    assert a.token_advantages is None and a.advantage == 0.0


def test_token_advantages_must_match_the_response_and_round_trip_through_json():
    with pytest.raises(ValueError, match="2 token_advantages for 3 response tokens"):
        Trajectory(**{**_episode([1.0], [(0, 3)], 3).to_json(), "token_advantages": [0, 1]})
    t = _episode([1.0, 0.0], [(0, 1), (2, 3)], 3)
    t.token_advantages = [0.5, 0.0, -0.5]
    back = Trajectory(**json.loads(json.dumps(t.to_json())))
    assert back.token_advantages == [0.5, 0.0, -0.5] and back.advantage_row() == [0.5, 0.0, -0.5]
