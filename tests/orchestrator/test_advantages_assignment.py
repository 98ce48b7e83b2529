import math

from temper.orchestrator.sync import assign_advantages
from temper.rollout.trajectory import Trajectory


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
