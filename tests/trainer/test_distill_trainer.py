"""The teacher's advantages in `PolicyTrainer` (`temper.trainer.distill`) on the built-in
model: teacher minus student on the sampled tokens, 0 on observations, the same packed
or not, and a step that moves the student towards the teacher."""

import copy

import pytest
import torch

from fp32 import SAME_MATH
from temper.algos import token_logprobs
from temper.algos.distill import full_reverse_kl
from temper.config.distill import DistillConfig
from temper.config.schema import AlgoConfig, TrainerConfig
from temper.models import load_model
from temper.records import Trajectory
from temper.trainer.policy_trainer import PolicyTrainer


def _sharp(model):
    """The model at temperature 1/2: its final norm doubled doubles every logit."""
    teacher = copy.deepcopy(model)
    with torch.no_grad():
        teacher.model.norm.weight.mul_(2)
    return teacher


def _logprobs(model, prompt, response):
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return token_logprobs(logits, torch.tensor(response))


def _trajs(model):
    """Two episodes whose middle tokens are observations (loss mask 0, behaviour 0.0);
    the sampled tokens carry the student's own logprobs, as an engine records them."""
    out = []
    for i, (prompt, response, mask) in enumerate(
        [
            ([1, 87, 85, 20], [33, 41, 9, 12, 57, 64], [1, 1, 0, 0, 1, 1]),
            ([1, 87, 85, 21], [71, 5, 18, 90, 44], [1, 0, 0, 1, 1]),
        ]
    ):
        own = _logprobs(model, prompt, response).tolist()
        behaviour = [lp if m else 0.0 for lp, m in zip(own, mask, strict=True)]
        out.append(
            Trajectory(
                task_id=f"t{i}", group_id=i, prompt_ids=prompt, response_ids=response,
                loss_mask=mask, behaviour_logprobs=behaviour, versions=[0] * len(response),
                finish_reason="stop", advantage=0.5 - i,
            )
        )  # fmt: skip
    return out


def _trainer(model, teacher, distill=None, lr=1e-3, **trainer):
    cfg = TrainerConfig(lr=lr, warmup_steps=0, **trainer)
    algo = AlgoConfig(advantage="distill")
    return PolicyTrainer(
        model, cfg, algo, 5, 0, teacher=teacher, distill=distill or DistillConfig(teacher="x")
    )


@pytest.mark.parametrize("packing", [False, True])
def test_advantages_are_teacher_minus_student_on_sampled_tokens(packing):
    model = load_model("tiny")
    teacher = _sharp(model)
    trajs = _trajs(model)
    distill = DistillConfig(teacher="x", coef=0.5, reward_weight=0.2)
    trainer = _trainer(model, teacher, distill, packing=packing)
    adv, stats = trainer._distill_advantages(trajs, [0, 1])
    kl_sum, count = 0.0, 0
    for i, t in enumerate(trajs):
        mask = torch.tensor(t.loss_mask, dtype=torch.float32)
        gap = _logprobs(teacher, t.prompt_ids, t.response_ids) - torch.tensor(t.behaviour_logprobs)
        expected = mask * (0.5 * gap + 0.2 * t.advantage)
        torch.testing.assert_close(adv[i], expected, **SAME_MATH)
        assert all(a == 0.0 for a, m in zip(adv[i].tolist(), t.loss_mask, strict=True) if not m)
        kl_sum += float(-(gap * mask).sum())
        count += int(mask.sum())
    torch.testing.assert_close(stats["distill_reverse_kl"], kl_sum / count, **SAME_MATH)
    assert stats["distill_reverse_kl"] > 0.05  # the sharper teacher is really elsewhere


def test_a_teacher_temperature_of_one_half_is_the_doubled_logits_teacher():
    model = load_model("tiny")
    trajs = _trajs(model)
    cooled = _trainer(
        model, load_model("tiny"), DistillConfig(teacher="x", teacher_temperature=0.5)
    )
    sharp = _trainer(model, _sharp(model))
    adv_cooled, stats_cooled = cooled._distill_advantages(trajs, [0, 1])
    adv_sharp, stats_sharp = sharp._distill_advantages(trajs, [0, 1])
    for i in (0, 1):
        torch.testing.assert_close(adv_cooled[i], adv_sharp[i], **SAME_MATH)
    assert stats_cooled["distill_reverse_kl"] == pytest.approx(stats_sharp["distill_reverse_kl"])
    assert stats_cooled["distill_reverse_kl"] > 0.05  # not the student's own distribution


def test_a_step_lowers_the_reverse_kl_to_the_teacher():
    model = load_model("tiny")
    teacher = _sharp(model)
    trajs = _trajs(model)
    trainer = _trainer(model, teacher)
    before = trainer._distill_advantages(trajs, [0, 1])[1]["distill_reverse_kl"]
    for _ in range(3):
        stats = trainer.train_step(trajs)
        assert stats["grad_norm"] > 0
        for t in trajs:  # the student's logprobs now, as the next samples would carry
            own = _logprobs(model, t.prompt_ids, t.response_ids).tolist()
            t.behaviour_logprobs = [
                lp if m else 0.0 for lp, m in zip(own, t.loss_mask, strict=True)
            ]
    after = trainer._distill_advantages(trajs, [0, 1])[1]["distill_reverse_kl"]
    assert after < 0.8 * before, (before, after)
    # The teacher is frozen: its weights never took a step.
    assert torch.equal(teacher.model.norm.weight, 2 * load_model("tiny").model.norm.weight)


def _full_kl(student, teacher, trajs, temperature=1.0):
    """The token-weighted mean over sampled tokens of the exact reverse KL, from plain
    forwards of both models."""
    total, count = 0.0, 0
    for t in trajs:
        ids = torch.tensor([t.prompt_ids + t.response_ids])
        with torch.no_grad():
            s, q = (
                m(input_ids=ids).logits[0, len(t.prompt_ids) - 1 : -1] for m in (student, teacher)
            )
        mask = torch.tensor(t.loss_mask, dtype=torch.float32)
        total += float((full_reverse_kl(s, q, temperature) * mask).sum())
        count += int(mask.sum())
    return total / count


@pytest.mark.parametrize("packing", [False, True])
def test_the_full_estimator_minimises_the_exact_kl_over_sampled_positions(packing):
    model = load_model("tiny")
    teacher = _sharp(model)
    trajs = _trajs(model)
    distill = DistillConfig(teacher="x", estimator="full", reward_weight=0.2)
    # A small rate: Adam's first steps at 1e-3 overshoot the exact KL on nine tokens.
    trainer = _trainer(model, teacher, distill, lr=1e-5, packing=packing)
    # The teacher's term left the advantages: they carry the reward's share only.
    adv, _ = trainer._distill_advantages(trajs, [0, 1])
    for i, t in enumerate(trajs):
        expected = 0.2 * t.advantage * torch.tensor(t.loss_mask, dtype=torch.float32)
        torch.testing.assert_close(adv[i], expected, **SAME_MATH)
    before = _full_kl(model, teacher, trajs)
    stats = trainer.train_step(trajs)
    # Taken at the step's starting weights, over the sampled positions only (an
    # observation counted would change the mean: its KL is not 0).
    assert stats["distill_full_kl"] == pytest.approx(before, rel=1e-5)
    assert before > 0.05
    kls = [before]
    for _ in range(3):
        trainer.train_step(trajs)
        kls.append(_full_kl(model, teacher, trajs))
    assert kls == sorted(kls, reverse=True) and kls[-1] < 0.6 * before, kls


def test_the_full_estimator_of_the_student_itself_is_zero_with_no_gradient():
    model = load_model("tiny")
    trajs = _trajs(model)
    distill = DistillConfig(teacher="x", estimator="full", teacher_temperature=0.5)
    cooled = _trainer(model, copy.deepcopy(model), distill)
    sharp = _sharp(model)
    # Cooling a copy of the student is the doubled-logits teacher.
    assert cooled.train_step(copy.deepcopy(trajs))["distill_full_kl"] == pytest.approx(
        _full_kl(load_model("tiny"), sharp, trajs), rel=1e-5
    )
    same = _trainer(
        load_model("tiny"), load_model("tiny"), DistillConfig(teacher="x", estimator="full")
    )
    stats = same.train_step(trajs)
    assert abs(stats["distill_full_kl"]) < 1e-6
    assert stats["grad_norm"] < 1e-4  # fp32 rounding of two equal log-softmaxes; 0.1+ apart


def test_the_full_estimator_leaves_out_the_columns_only_a_padded_teacher_has():
    model = load_model("tiny")
    trajs = _trajs(model)
    teacher = _sharp(model)
    padded = copy.deepcopy(teacher)
    padded.resize_token_embeddings(model.config.vocab_size + 5)
    with torch.no_grad():  # five ids no student token has, each very likely to the teacher
        padded.lm_head.weight[-5:] = 3 * padded.lm_head.weight[:5]
    distill = DistillConfig(teacher="x", estimator="full")
    stats = _trainer(model, padded, distill).train_step(trajs)
    assert stats["distill_full_kl"] == pytest.approx(
        _full_kl(load_model("tiny"), teacher, trajs), rel=1e-5
    )
