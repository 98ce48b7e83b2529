"""On-policy distillation's per-token advantages (`temper.algos.distill`), by hand."""

import pytest
import torch

from temper.algos.distill import distill_advantages, reverse_kl_sums


def test_advantage_is_teacher_minus_student_on_sampled_tokens_only():
    teacher = torch.tensor([-0.5, -2.0, -1.0, -0.1])
    student = torch.tensor([-1.5, -0.5, -9.0, -0.1])
    mask = torch.tensor([1, 1, 0, 1])  # token 2 is an observation: no advantage
    adv = distill_advantages(teacher, student, mask)
    assert adv.tolist() == pytest.approx([1.0, -1.5, 0.0, 0.0])


def test_coef_scales_and_the_task_reward_joins_every_sampled_token():
    teacher = torch.tensor([-0.5, -2.0, -1.0])
    student = torch.tensor([-1.5, -0.5, -1.0])
    mask = torch.tensor([1, 1, 0])
    adv = distill_advantages(
        teacher, student, mask, coef=0.5, outcome_advantage=2.0, reward_weight=0.25
    )
    # 0.5 * (teacher - student) + 0.25 * 2.0 on sampled tokens, 0 on the observation.
    assert adv.tolist() == pytest.approx([0.5 * 1.0 + 0.5, 0.5 * -1.5 + 0.5, 0.0])


def test_reverse_kl_sums_count_sampled_tokens():
    teacher = torch.tensor([-0.5, -2.0, -1.0, -3.0])
    student = torch.tensor([-1.5, -0.5, -9.0, -1.0])
    mask = torch.tensor([1, 1, 0, 1])
    total, count = reverse_kl_sums(teacher, student, mask)
    # (student - teacher): -1.0 + 1.5 + 2.0 over three sampled tokens.
    assert count == 3.0
    assert total == pytest.approx(2.5)


def test_shapes_must_match():
    with pytest.raises(ValueError, match="must match"):
        distill_advantages(torch.zeros(3), torch.zeros(2), torch.ones(3))
