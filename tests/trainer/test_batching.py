import pytest
import torch

from temper.models import load_model
from temper.rollout.trajectory import Trajectory
from temper.trainer.batching import collate, plan_micro_batches
from temper.trainer.forward import response_logits
from temper.trainer.optim import lr_multiplier


def _traj(prompt, resp, mask=None, adv=0.0):
    mask = mask if mask is not None else [1] * len(resp)
    return Trajectory(
        task_id="t",
        group_id=0,
        prompt_ids=list(prompt),
        response_ids=list(resp),
        loss_mask=mask,
        behaviour_logprobs=[-0.5] * len(resp),
        versions=[0] * len(resp),
        finish_reason="stop",
        advantage=adv,
    )


def _cost(trajs, rows):
    prompts = {tuple(trajs[i].prompt_ids) for i in rows}
    longest_p = max(len(trajs[i].prompt_ids) for i in rows)
    longest_r = max(len(trajs[i].response_ids) for i in rows)
    return len(prompts) * longest_p + len(rows) * longest_r


def test_plan_groups_rows_by_prompt_within_budget():
    p1, p2 = [1, 2, 3, 4], [5, 6]
    trajs = [_traj(p1, [9] * n) for n in (3, 5, 2)] + [_traj(p2, [9] * n) for n in (4, 1)]
    trajs.insert(1, _traj(p2, [9] * 6))
    plan = plan_micro_batches(trajs, token_budget=24)
    assert sorted(i for mb in plan for i in mb) == list(range(len(trajs)))
    for mb in plan:
        assert len(mb) == 1 or _cost(trajs, mb) <= 24
    # Group of p1 first (first seen), longest response first inside it.
    assert plan[0][:3] == [2, 0, 3]
    # One big budget: everything in one micro-batch, each prompt counted once.
    assert plan_micro_batches(trajs, token_budget=10_000) == [[2, 0, 3, 1, 4, 5]]


def test_oversized_row_gets_its_own_batch():
    trajs = [_traj([1] * 40, [2] * 10), _traj([3], [4])]
    assert plan_micro_batches(trajs, token_budget=16) == [[0], [1]]


def test_collate_shares_prompts_and_aligns_response_tensors():
    a = _traj([1, 2], [3, 4, 5], [1, 0, 1], 2.0)
    b = _traj([6], [7], [1], -1.0)
    c = _traj([1, 2], [8], [1], 0.5)
    mb = collate([a, b, c], [0, 1, 2], pad_id=0)
    assert mb.prompt_ids.tolist() == [[1, 2], [6, 0]]
    assert mb.prompt_lengths.tolist() == [2, 1]
    assert mb.prompt_index.tolist() == [0, 1, 0]
    assert mb.response_ids.tolist() == [[3, 4, 5], [7, 0, 0], [8, 0, 0]]
    assert mb.loss_mask.tolist() == [[1, 0, 1], [1, 0, 0], [1, 0, 0]]
    assert mb.advantages.tolist() == [[2.0] * 3, [-1.0, 0, 0], [0.5, 0, 0]]
    assert mb.behaviour_logprobs[0].tolist() == [-0.5] * 3


def _plain_logprobs(model, t):
    ids = torch.tensor([t.prompt_ids + t.response_ids])
    logits = model(input_ids=ids).logits[0, len(t.prompt_ids) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(
        1, torch.tensor(t.response_ids).unsqueeze(1)
    )[:, 0]


@pytest.mark.parametrize("max_response", [1, 7])
def test_shared_prompt_forward_equals_plain_forward(max_response):
    """Logprobs and gradients match running each prompt + response row on its own."""
    model = load_model("tiny")
    g = torch.Generator().manual_seed(0)

    def ids(n):
        return torch.randint(3, 600, (n,), generator=g).tolist()

    p1, p2 = ids(9), ids(4)
    lens = [max_response, 3, 1, max_response, 2] if max_response > 1 else [1] * 5
    trajs = [_traj(p, ids(n)) for p, n in zip([p1, p1, p1, p2, p2], lens, strict=True)]

    mb = collate(trajs, list(range(len(trajs))), pad_id=0)
    logits = response_logits(model, mb)
    shared = torch.log_softmax(logits, -1).gather(2, mb.targets.unsqueeze(2))[..., 0]
    (shared * mb.loss_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    total = 0.0
    for row, t in enumerate(trajs):
        plain = _plain_logprobs(model, t)
        torch.testing.assert_close(shared[row, : len(plain)], plain, atol=1e-5, rtol=0)
        total = total + plain.sum()
    total.backward()
    for n, p in model.named_parameters():
        # Gradients reach ~50 in magnitude: compare by relative norm (float32 rounding ~1e-6).
        rel = float((grads[n] - p.grad).norm() / p.grad.norm().clamp(min=1e-12))
        assert rel < 1e-5, (n, rel)


def test_lr_schedule():
    assert lr_multiplier(0, 4, 100, "constant") == 0.25
    assert lr_multiplier(3, 4, 100, "constant") == 1.0
    assert lr_multiplier(50, 0, 100, "constant") == 1.0
    assert lr_multiplier(4, 4, 104, "cosine") == 1.0
    assert abs(lr_multiplier(54, 4, 104, "cosine") - 0.5) < 1e-9
    assert abs(lr_multiplier(104, 4, 104, "linear")) < 1e-9
