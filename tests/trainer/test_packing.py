"""Sequence packing: the plan, the rank partition, and the packed forward against the
unpacked one (loss, gradients, trainer logprobs) on the trainer's own code."""

import copy
import random

import pytest
import torch
from tests.trainer.loss_grads import summed_loss_and_grads

from fp32 import SAME_MATH
from temper.config.schema import AlgoConfig, TrainerConfig
from temper.models import load_model
from temper.records import Trajectory
from temper.trainer.batching import MicroBatch
from temper.trainer.packing import (
    PackedMicroBatch,
    collate_packed,
    partition_by_tokens,
    plan_packed_rows,
    shard_by_tokens,
)
from temper.trainer.policy_trainer import PolicyTrainer


def _traj(prompt, n_resp, rng, mask=None, adv=0.0):
    resp = [rng.randint(3, 700) for _ in range(n_resp)]
    return Trajectory(
        task_id="t",
        group_id=0,
        prompt_ids=list(prompt),
        response_ids=resp,
        loss_mask=mask if mask is not None else [1] * n_resp,
        behaviour_logprobs=[-(k % 5) / 2 for k in range(n_resp)],
        versions=[0] * n_resp,
        finish_reason="stop",
        advantage=adv,
    )


def _multi_turn_mask(n, rng):
    """Sampled turns (1) with observation runs (0) between them."""
    mask, sampled = [], True
    while len(mask) < n:
        mask += [int(sampled)] * min(n - len(mask), rng.randint(2, 6))
        sampled = not sampled
    return mask


def _batch(seed=0):
    """Three groups (one of 4 multi-turn episodes, one with a 1-token response, one alone)."""
    rng = random.Random(seed)
    p1, p2, p3 = ([rng.randint(3, 700) for _ in range(n)] for n in (9, 5, 3))
    out = []
    for n in (23, 11, 17, 4):
        out.append(_traj(p1, n, rng, _multi_turn_mask(n, rng), adv=rng.uniform(-1, 1)))
    for n in (6, 1, 13):
        out.append(_traj(p2, n, rng, adv=rng.uniform(-1, 1)))
    out.append(_traj(p3, 40, rng, _multi_turn_mask(40, rng), adv=0.7))
    rng.shuffle(out)
    return out


def _fed(trajs, rows):
    """Tokens a packed row of ``rows`` runs: each distinct prompt once, responses less one."""
    prompts = {tuple(trajs[i].prompt_ids) for i in rows}
    return sum(map(len, prompts)) + sum(max(len(trajs[i].response_ids) - 1, 0) for i in rows)


def _loss_grads(trajs, cfg, algo):
    """The trainer's summed micro-batch losses and the gradients, before any optimizer step."""
    trainer = PolicyTrainer(load_model("tiny"), cfg, algo, 1, pad_id=0)
    loss, grads, kinds, plan = summed_loss_and_grads(trainer, trajs)
    return loss, grads, kinds, len(plan)


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_packed_loss_and_gradients_equal_the_unpacked_ones(loss_agg):
    algo = AlgoConfig(loss_agg=loss_agg, entropy_coef=0.01)
    base = _batch()
    packed_trajs, plain_trajs = copy.deepcopy(base), copy.deepcopy(base)
    # 48 tokens: the 4-episode group is cut over rows (its prompt runs in each), the
    # 40-token episode has a row alone, and other rows hold several groups.
    cfg = TrainerConfig(micro_batch_tokens=48)
    loss_p, grads_p, kinds_p, rows = _loss_grads(
        packed_trajs, cfg.model_copy(update={"packing": True}), algo
    )
    loss_u, grads_u, kinds_u, _ = _loss_grads(plain_trajs, cfg, algo)
    assert kinds_p == {PackedMicroBatch} and kinds_u == {MicroBatch} and rows > 2
    assert loss_p == pytest.approx(loss_u, rel=1e-5, abs=1e-7)
    for name, g in grads_u.items():
        rel = float((grads_p[name] - g).norm() / g.norm().clamp(min=1e-12))
        assert rel < 1e-5, (name, rel)
    for a, b in zip(packed_trajs, plain_trajs, strict=True):
        torch.testing.assert_close(
            torch.tensor(a.trainer_logprobs), torch.tensor(b.trainer_logprobs), **SAME_MATH
        )


def test_packed_row_shares_prompts_and_restarts_positions():
    rng = random.Random(3)
    a, b, c = _traj([5, 6, 7], 4, rng), _traj([9, 8], 3, rng), _traj([5, 6, 7], 2, rng)
    mb = collate_packed([a, b, c], [0, 1, 2], pad_id=0)
    # prompt [5,6,7] once, a's and c's responses (less their last token), then b's group.
    assert mb.input_ids[0].tolist() == [
        5,
        6,
        7,
        *a.response_ids[:3],
        c.response_ids[0],
        9,
        8,
        *b.response_ids[:2],
    ]
    assert mb.position_ids[0].tolist() == [0, 1, 2, 3, 4, 5, 3, 0, 1, 2, 3]
    # Segments: prompt 1, response a, response c, prompt 2, response b; a response's
    # keys are its prompt's then its own, never a sibling's.
    assert mb.layout.cu_q.tolist() == [0, 3, 6, 7, 9, 11]
    keys = mb.layout.key_index.tolist()
    cu_k = mb.layout.cu_k.tolist()
    assert [keys[cu_k[s] : cu_k[s + 1]] for s in range(5)] == [
        [0, 1, 2], [0, 1, 2, 3, 4, 5], [0, 1, 2, 6], [7, 8], [7, 8, 9, 10]
    ]  # fmt: skip
    assert mb.loss_mask.tolist()[1] == [1, 1, 1, 0]


def test_rows_hold_every_trajectory_once_within_the_budget_and_nearly_full():
    rng = random.Random(7)
    trajs = []
    for _ in range(24):  # tool-use-like: groups of 4 episodes, 50 to 1500 tokens, long-tailed
        prompt = [rng.randint(3, 700) for _ in range(rng.randint(20, 200))]
        trajs += [_traj(prompt, min(1500, int(50 * rng.paretovariate(1.2))), rng) for _ in range(4)]
    budget = 4096
    plan = plan_packed_rows(trajs, budget)
    assert sorted(i for row in plan for i in row) == list(range(len(trajs)))
    assert all(_fed(trajs, row) <= budget for row in plan)
    fill = sum(_fed(trajs, row) for row in plan) / (len(plan) * budget)
    assert fill > 0.9, fill
    # The plan depends on the rows' contents, not their order.
    perm = list(range(len(trajs)))
    rng.shuffle(perm)
    shuffled = [trajs[i] for i in perm]

    def contents(ts, p):
        return sorted(sorted((ts[i].prompt_ids, ts[i].response_ids) for i in row) for row in p)

    assert contents(shuffled, plan_packed_rows(shuffled, budget)) == contents(trajs, plan)


def test_a_trajectory_longer_than_the_budget_gets_a_row_alone():
    rng = random.Random(1)
    trajs = [_traj([1] * 10, 100, rng), _traj([2] * 4, 5, rng), _traj([1] * 10, 3, rng)]
    plan = plan_packed_rows(trajs, 32)
    assert [0] in plan and sorted(i for row in plan for i in row) == [0, 1, 2]


def test_largest_differencing_partition():
    assert partition_by_tokens([5, 5, 4, 3, 3, 1], 2) == [[0, 3, 4], [1, 2, 5]]  # 11 / 10
    rng = random.Random(2)
    weights = [min(6000, int(200 * rng.paretovariate(1.1))) for _ in range(64)]
    for parts in (2, 4, 8):
        split = partition_by_tokens(weights, parts)
        assert sorted(i for p in split for i in p) == list(range(len(weights)))
        sums = [sum(weights[i] for i in p) for p in split]
        assert max(sums) - min(sums) <= 0.01 * sum(weights), (parts, sums)
        assert partition_by_tokens(weights, parts) == split  # deterministic
    assert partition_by_tokens([], 3) == [[], [], []]
    assert partition_by_tokens([7], 2) == [[0], []]


def test_ranks_get_whole_groups_balanced_by_tokens_not_rows():
    rng = random.Random(4)
    trajs = []
    for _ in range(16):
        prompt = [rng.randint(3, 700) for _ in range(rng.randint(20, 100))]
        trajs += [_traj(prompt, min(1500, int(50 * rng.paretovariate(1.2))), rng) for _ in range(4)]
    rows = list(range(len(trajs)))
    shards = shard_by_tokens(trajs, rows, 4)
    assert sorted(i for s in shards for i in s) == rows
    for s in shards:  # a group's prompt lives on one rank
        others = {tuple(trajs[i].prompt_ids) for t in shards if t is not s for i in t}
        assert not others & {tuple(trajs[i].prompt_ids) for i in s}
    tokens = [_fed(trajs, s) for s in shards]
    sliced = [_fed(trajs, rows[r * 16 : (r + 1) * 16]) for r in range(4)]  # today's split
    assert max(tokens) - min(tokens) < (max(sliced) - min(sliced)) / 4, (tokens, sliced)
    assert max(tokens) - min(tokens) <= 0.05 * sum(tokens)
    # Every rank computes the same plan, whatever order the rows arrive in.
    perm = rows[:]
    rng.shuffle(perm)
    shuffled = [trajs[i] for i in perm]
    again = shard_by_tokens(shuffled, rows, 4)
    assert [sorted(shuffled[i].response_ids for i in s) for s in again] == [
        sorted(trajs[i].response_ids for i in s) for s in shards
    ]


def test_collate_packed_refuses_images():
    t = _traj([1, 2, 3], 2, random.Random(0))
    t.images = [[0, "ab" * 32]]
    with pytest.raises(ValueError, match="images are not packed"):
        collate_packed([t], [0], pad_id=0)


def _with_turn_advantages(trajs, seed=1):
    """Per-token advantages: one value per run of policy tokens (a turn), 0 elsewhere."""
    rng = random.Random(seed)
    for t in trajs:
        values, current, prev = [], 0.0, 0
        for m in t.loss_mask:
            if m and not prev:
                current = rng.uniform(-2, 2)
            values.append(current if m else 0.0)
            prev = m
        t.token_advantages = values
    return trajs


def test_per_token_advantages_train_the_same_packed_and_unpacked():
    algo = AlgoConfig(loss_agg="token-mean")
    base = _with_turn_advantages(_batch())
    cfg = TrainerConfig(micro_batch_tokens=48)
    loss_p, grads_p, _, _ = _loss_grads(
        copy.deepcopy(base), cfg.model_copy(update={"packing": True}), algo
    )
    loss_u, grads_u, _, _ = _loss_grads(copy.deepcopy(base), cfg, algo)
    assert loss_p == pytest.approx(loss_u, rel=1e-5, abs=1e-7)
    for name, g in grads_u.items():
        rel = float((grads_p[name] - g).norm() / g.norm().clamp(min=1e-12))
        assert rel < 1e-5, (name, rel)
    # The per-token values are what trained: broadcasting `advantage` gives another loss.
    broadcast = copy.deepcopy(base)
    for t in broadcast:
        t.token_advantages = None
    loss_b, _, _, _ = _loss_grads(broadcast, cfg, algo)
    assert abs(loss_b - loss_u) > 1e-3 * max(abs(loss_u), 1e-3)
    packed = collate_packed(base, list(range(len(base))), pad_id=0)
    for b, t in enumerate(base):
        row = packed.advantages[b, : len(t.response_ids)]
        assert row.tolist() == pytest.approx(t.token_advantages)
