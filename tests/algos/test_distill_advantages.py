"""On-policy distillation's per-token advantages and its full-vocabulary reverse KL
(`temper.algos.distill`), by hand."""

import math

import pytest
import torch

from temper.algos.distill import distill_advantages, full_reverse_kl, reverse_kl_sums


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


def test_full_reverse_kl_by_hand_and_zero_against_itself():
    student = torch.tensor([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
    teacher = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    kl = full_reverse_kl(student, teacher)
    for k in range(2):
        p = [math.exp(x) / sum(math.exp(y) for y in student[k].tolist()) for x in student[k]]
        q = [math.exp(x) / sum(math.exp(y) for y in teacher[k].tolist()) for x in teacher[k]]
        by_hand = sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q, strict=True))
        assert float(kl[k]) == pytest.approx(by_hand, rel=1e-6)
    assert float(kl.min()) > 0.1
    assert full_reverse_kl(student, student).abs().max() < 1e-6
    # A teacher temperature of 1/2 is the teacher with doubled logits.
    doubled = full_reverse_kl(student, 2 * teacher)
    torch.testing.assert_close(full_reverse_kl(student, teacher, 0.5), doubled)
    with pytest.raises(ValueError, match="another vocabulary"):
        full_reverse_kl(student, teacher[:, :2])


def test_full_reverse_kl_gradient_is_the_sampled_estimators_expectation():
    """The loss's gradient in the student's logits equals the policy gradient of the
    sampled advantage log p_t(y) - log p_s(y), averaged exactly over y ~ p_s."""
    g = torch.Generator().manual_seed(0)
    student = torch.randn(7, generator=g, dtype=torch.float64).requires_grad_()
    teacher = torch.randn(7, generator=g, dtype=torch.float64)
    full_reverse_kl(student, teacher).backward()
    log_s = torch.log_softmax(student.detach(), -1)
    log_t = torch.log_softmax(teacher, -1)
    expected = torch.zeros(7, dtype=torch.float64)
    for y in range(7):
        grad_log_p = torch.nn.functional.one_hot(torch.tensor(y), 7) - log_s.exp()
        # the policy gradient descends -(advantage x log p): its gradient is -adv x grad
        expected += log_s[y].exp() * -(log_t[y] - log_s[y]) * grad_log_p
    torch.testing.assert_close(student.grad, expected, rtol=1e-5, atol=1e-6)
    assert float(student.grad.abs().max()) > 1e-3
