"""DPO's update in `PolicyTrainer` (`temper.trainer.preference`) on the built-in model."""

import pytest
import torch

from fp32 import SAME_MATH
from temper.config.dpo import DPOConfig
from temper.config.schema import AlgoConfig, TrainerConfig
from temper.models import load_model
from temper.records import Trajectory
from temper.trainer.policy_trainer import PolicyTrainer
from temper.trainer.preference import ResponsePair, pair_rows, plan_pairs


def _traj(prompt, response, mask=None):
    n = len(response)
    return Trajectory(
        task_id="t", group_id=0, prompt_ids=list(prompt), response_ids=list(response),
        loss_mask=mask or [1] * n, behaviour_logprobs=[0.0] * n, versions=[-1] * n,
        finish_reason="stop",
    )  # fmt: skip


def _pairs(n=6):
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        prompt = [1, 87, 85, 20 + i]
        c = torch.randint(3, 600, (4 + i % 3,), generator=g).tolist()
        r = torch.randint(3, 600, (7 - i % 3,), generator=g).tolist()
        # The rejected answer's last token is not the policy's (an observation, say).
        out.append(ResponsePair(_traj(prompt, c), _traj(prompt, r, [1] * (len(r) - 1) + [0])))
    return out


def _trainer(model, dpo=None, lr=1e-4, **trainer):
    cfg = TrainerConfig(lr=lr, warmup_steps=0, **trainer)
    return PolicyTrainer(model, cfg, AlgoConfig(), 5, 0, dpo=dpo or DPOConfig())


def _with_reference(trainer, pairs):
    sums = trainer.sequence_logprobs(pair_rows(pairs))
    for k, p in enumerate(pairs):
        p.ref_chosen, p.ref_rejected = sums[2 * k], sums[2 * k + 1]
    return pairs


def _margins(trainer, pairs):
    sums = trainer.sequence_logprobs(pair_rows(pairs))
    return [
        (sums[2 * k] - p.ref_chosen) - (sums[2 * k + 1] - p.ref_rejected)
        for k, p in enumerate(pairs)
    ]


def test_sequence_logprobs_sum_the_policy_tokens_of_a_plain_forward():
    model = load_model("tiny")
    trainer = _trainer(model)
    trajs = pair_rows(_pairs(3))
    expected = []
    with torch.no_grad():
        for t in trajs:
            ids = torch.tensor([t.prompt_ids + t.response_ids])
            logits = model(input_ids=ids).logits[0, len(t.prompt_ids) - 1 : -1]
            lp = torch.log_softmax(logits, -1).gather(1, torch.tensor([t.response_ids]).T)[:, 0]
            expected.append(float((lp * torch.tensor(t.loss_mask)).sum()))
    got = trainer.sequence_logprobs(trajs)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), **SAME_MATH)
    with pytest.raises(ValueError, match="ref_model"):
        trainer.sequence_logprobs(trajs, reference=True)


def test_plan_keeps_pairs_whole_and_within_the_budget():
    pairs = _pairs(6)
    for packed in (False, True):
        plan = plan_pairs(pairs, 40, packed)
        assert sorted(i for b in plan for i in b) == list(range(6))
        assert len(plan) > 1
    assert plan_pairs(pairs, 10_000, packed=False) == [[0, 3, 1, 2, 4, 5]]  # longest first
    assert [len(b) for b in plan_pairs(pairs, 1, packed=False)] == [1] * 6  # each alone


# IPO's target margin is 1 / (2 beta) = 10 here, further than one step moves these margins.
@pytest.mark.parametrize(
    ("loss", "beta", "at_reference"),
    [("sigmoid", 0.5, 0.6931472), ("ipo", 0.05, 100.0)],  # log 2; (0 - 1 / (2 beta))^2
)
def test_a_step_starts_at_the_reference_and_widens_the_margins(loss, beta, at_reference):
    model = load_model("tiny")
    trainer = _trainer(model, DPOConfig(loss=loss, beta=beta))
    pairs = _with_reference(trainer, _pairs())
    stats = trainer.train_pairs(pairs)
    assert stats["dpo/loss"] == pytest.approx(at_reference, rel=1e-5)
    assert stats["dpo/margin"] == pytest.approx(0.0, abs=1e-4)
    assert stats["dpo/kl"] == pytest.approx(0.0, abs=1e-5)
    assert stats["grad_norm"] > 0 and stats["loss"] == stats["dpo/loss"]
    margins = _margins(trainer, pairs)
    assert sum(margins) / len(margins) > 0
    after = trainer.train_pairs(pairs)  # the second step sees the first one's margins
    assert after["dpo/margin"] > 0 and after["dpo/loss"] < stats["dpo/loss"]
    assert after["dpo/rewards_chosen"] > after["dpo/rewards_rejected"]


def test_train_pairs_needs_the_reference():
    trainer = _trainer(load_model("tiny"))
    with pytest.raises(ValueError, match="reference logprobs"):
        trainer.train_pairs(_pairs(2))
    assert trainer.train_pairs([]) == {}


def _gradients(**trainer):
    """The gradients of one step (taken at the starting weights; unclipped)."""
    model = load_model("tiny")
    t = _trainer(model, grad_clip=1e9, **trainer)
    t.train_pairs(_with_reference(t, _pairs()))
    return {k: p.grad.clone() for k, p in model.named_parameters()}


def test_micro_batches_and_packing_give_the_gradient_of_one_batch():
    whole = _gradients()
    for kw in ({"micro_batch_tokens": 40}, {"packing": True, "micro_batch_tokens": 40}):
        cut = _gradients(**kw)
        for name, value in whole.items():
            torch.testing.assert_close(cut[name], value, **SAME_MATH, msg=f"{kw} {name}")
