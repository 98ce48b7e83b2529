import itertools
import random

import pytest
import torch

from fp32 import SAME_MATH
from temper.models import load_model
from temper.records import Trajectory
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


def test_plan_covers_every_row_once_within_budget_longest_first():
    p1, p2 = [1, 2, 3, 4], [5, 6]
    trajs = [_traj(p1, [9] * n) for n in (3, 5, 2)] + [_traj(p2, [9] * n) for n in (4, 1)]
    trajs.insert(1, _traj(p2, [9] * 6))
    plan = plan_micro_batches(trajs, token_budget=24)
    assert sorted(i for mb in plan for i in mb) == list(range(len(trajs)))
    for mb in plan:
        assert len(mb) == 1 or _cost(trajs, mb) <= 24
    # One big budget and a large per-micro-batch cost: one micro-batch, longest first.
    assert plan_micro_batches(trajs, token_budget=10_000, overhead=1000) == [[1, 2, 4, 0, 3, 5]]


def test_plan_puts_long_tail_rows_apart_from_short_ones():
    prompt = [1] * 8
    trajs = [_traj(prompt, [9] * n) for n in (4, 100, 3, 4, 96, 2, 3, 4)]
    plan = plan_micro_batches(trajs, token_budget=10_000, overhead=16)
    assert plan == [[1, 4], [0, 3, 7, 2, 6, 5]]
    # The padding saved outweighs the one extra micro-batch.
    one = _cost(trajs, range(len(trajs))) + 16
    assert sum(_cost(trajs, mb) + 16 for mb in plan) < one / 3


def _brute_force_best(trajs, order, budget, overhead):
    """Least cost over every way to cut ``order`` into contiguous micro-batches."""
    n = len(order)
    best = None
    for mask in range(1 << (n - 1)):
        cuts = [0] + [k + 1 for k in range(n - 1) if mask >> k & 1] + [n]
        batches = [order[a:b] for a, b in itertools.pairwise(cuts)]
        if any(len(b) > 1 and _cost(trajs, b) > budget for b in batches):
            continue
        total = sum(_cost(trajs, b) + overhead for b in batches)
        best = total if best is None else min(best, total)
    return best


def test_plan_is_the_cheapest_cut_of_the_sorted_rows():
    rng = random.Random(0)
    prompts = [[1] * 5, [2] * 9, [3] * 2]
    for _ in range(40):
        trajs = [
            _traj(rng.choice(prompts), [9] * rng.randint(1, 30)) for _ in range(rng.randint(1, 9))
        ]
        budget, overhead = rng.choice([20, 60, 400]), rng.choice([0, 8, 64])
        plan = plan_micro_batches(trajs, budget, overhead)
        order = [i for mb in plan for i in mb]
        assert sorted(order) == list(range(len(trajs)))
        lengths = [len(trajs[i].response_ids) for i in order]
        assert lengths == sorted(lengths, reverse=True)
        got = sum(_cost(trajs, mb) + overhead for mb in plan)
        assert got == _brute_force_best(trajs, order, budget, overhead)


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
        torch.testing.assert_close(shared[row, : len(plain)], plain, **SAME_MATH)
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


def test_plan_depends_on_the_rows_not_their_order():
    rng = random.Random(1)
    prompts = [[1] * 5, [2] * 9]
    trajs = [_traj(rng.choice(prompts), [rng.randint(3, 9)] * rng.randint(1, 6)) for _ in range(12)]
    plan = plan_micro_batches(trajs, 40, 8)
    perm = list(range(len(trajs)))
    rng.shuffle(perm)
    shuffled = [trajs[i] for i in perm]
    plan_shuffled = plan_micro_batches(shuffled, 40, 8)

    def contents(ts, p):
        return [[(tuple(ts[i].prompt_ids), tuple(ts[i].response_ids)) for i in mb] for mb in p]

    assert len(plan) > 1
    assert contents(shuffled, plan_shuffled) == contents(trajs, plan)
