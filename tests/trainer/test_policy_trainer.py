"""The policy update on the built-in model with synthetic trajectories."""

import copy

import pytest
import torch

from fp32 import SAME_MATH
from temper.config.schema import AlgoConfig, TrainerConfig
from temper.models import load_model
from temper.records import Trajectory
from temper.trainer.policy_trainer import PolicyTrainer


def _trajs(n=8):
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        resp = torch.randint(3, 600, (6 + i % 3,), generator=g).tolist()
        out.append(
            Trajectory(
                task_id=f"t{i // 4}",
                group_id=i // 4,
                prompt_ids=[1, 87, 85, 20 + i % 4],
                response_ids=resp,
                loss_mask=[1] * len(resp),
                behaviour_logprobs=[-1.0] * len(resp),
                versions=[0] * len(resp),
                finish_reason="stop",
                advantage=1.0 if i % 2 else -1.0,
            )
        )
    return out


def _objective(trainer, model, trajs):
    """sum_i A_i * (sum of logprobs of i's response tokens) under the current weights."""
    lps = trainer._logprobs_no_grad(model, trajs)  # response-aligned, padded to the batch
    return sum(
        t.advantage * float(lps[i][: len(t.response_ids)].sum()) for i, t in enumerate(trajs)
    )


def test_train_step_records_the_trainers_logprobs_before_the_update():
    model = load_model("tiny")
    trajs = _trajs()
    expected = []
    with torch.no_grad():
        for t in trajs:
            ids = torch.tensor([t.prompt_ids + t.response_ids])
            logits = model(input_ids=ids).logits[0, len(t.prompt_ids) - 1 : -1]
            lp = torch.log_softmax(logits, -1).gather(1, torch.tensor([t.response_ids]).T)[:, 0]
            expected.append(lp)
    trainer = PolicyTrainer(model, TrainerConfig(lr=1e-2, warmup_steps=0), AlgoConfig(), 5, 0)
    trainer.train_step(trajs)
    for t, lp in zip(trajs, expected, strict=True):
        assert t.trainer_logprobs is not None and len(t.trainer_logprobs) == len(t.response_ids)
        torch.testing.assert_close(torch.tensor(t.trainer_logprobs), lp, **SAME_MATH)


def test_update_ascends_the_policy_gradient_objective():
    model = load_model("tiny")
    trainer = PolicyTrainer(model, TrainerConfig(lr=1e-4, warmup_steps=0), AlgoConfig(), 5, 0)
    trajs = _trajs()
    before = _objective(trainer, model, trajs)
    stats = trainer.train_step(trajs)
    after = _objective(trainer, model, trajs)
    assert after > before
    assert stats["grad_norm"] > 0 and stats["lr"] == pytest.approx(1e-4)
    # Flipping the advantages moves the weights the other way.
    for t in trajs:
        t.advantage = -t.advantage
    trainer.train_step(trajs)
    assert _objective(trainer, model, trajs) > -after


def test_ppo_epochs_clip_and_kl_against_reference():
    model = load_model("tiny")
    ref = copy.deepcopy(model)
    algo = AlgoConfig(kl_coef=0.1, clip_low=0.05, clip_high=0.05)
    cfg = TrainerConfig(lr=5e-3, warmup_steps=0, ppo_epochs=3, mini_batches=2)
    trainer = PolicyTrainer(model, cfg, algo, 2, 0, ref_model=ref)
    stats = trainer.train_step(_trajs())
    # After the first optimizer step the ratio moves past the tight bounds.
    assert stats["clip_frac_low"] + stats["clip_frac_high"] > 0
    assert stats["kl"] > 0
    # The reference stays frozen.
    for (name, p), q in zip(ref.named_parameters(), load_model("tiny").parameters(), strict=True):
        assert torch.equal(p, q), name


def test_micro_batching_does_not_change_the_update():
    stats = []
    for budget in (16, 1 << 16):  # 16 tokens: one sequence per micro-batch
        model = load_model("tiny")
        trainer = PolicyTrainer(
            model,
            TrainerConfig(lr=1e-3, warmup_steps=0, micro_batch_tokens=budget),
            AlgoConfig(),
            1,
            0,
        )
        stats.append(trainer.train_step(_trajs()))
    assert stats[0]["loss"] == pytest.approx(stats[1]["loss"], rel=1e-5, abs=1e-7)
    assert stats[0]["grad_norm"] == pytest.approx(stats[1]["grad_norm"], rel=1e-5)
