import torch

from temper.rollout.trajectory import Trajectory
from temper.trainer.batching import collate, plan_micro_batches
from temper.trainer.optim import lr_multiplier


def test_plan_respects_budget_and_covers_all():
    lengths = [10, 3, 7, 7, 2, 9, 1]
    plan = plan_micro_batches(lengths, token_budget=20)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    for mb in plan:
        assert len(mb) * max(lengths[i] for i in mb) <= 20
    # Longest first: 10 and 9 fit together (2*10=20); 7,7 next (3*7=21 > 20 so 2 then ...)
    assert plan[0] == [0, 5]


def test_oversized_sequence_gets_its_own_batch():
    assert plan_micro_batches([50, 5], token_budget=16) == [[0], [1]]


def _traj(prompt, resp, mask, adv):
    return Trajectory(
        task_id="t",
        group_id=0,
        prompt_ids=prompt,
        response_ids=resp,
        loss_mask=mask,
        behaviour_logprobs=[-0.5] * len(resp),
        versions=[0] * len(resp),
        finish_reason="stop",
        advantage=adv,
    )


def test_collate_aligns_targets_masks_and_advantages():
    a = _traj([1, 2], [3, 4, 5], [1, 0, 1], 2.0)
    b = _traj([6], [7], [1], -1.0)
    mb = collate([a, b], [0, 1], pad_id=0)
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 0, 0, 0]]
    assert mb.targets.tolist() == [[2, 3, 4, 5], [7, 0, 0, 0]]
    # logits at position 1 predict token 3 (first response token).
    assert mb.loss_mask.tolist() == [[0, 1, 0, 1], [1, 0, 0, 0]]
    assert mb.advantages[0, 1:].tolist() == [2.0, 2.0, 2.0]
    assert mb.advantages[1].tolist() == [-1.0, 0, 0, 0]
    assert torch.equal(mb.attention_mask.sum(1), torch.tensor([5, 2]))


def test_lr_schedule():
    assert lr_multiplier(0, 4, 100, "constant") == 0.25
    assert lr_multiplier(3, 4, 100, "constant") == 1.0
    assert lr_multiplier(50, 0, 100, "constant") == 1.0
    assert lr_multiplier(4, 4, 104, "cosine") == 1.0
    assert abs(lr_multiplier(54, 4, 104, "cosine") - 0.5) < 1e-9
    assert abs(lr_multiplier(104, 4, 104, "linear")) < 1e-9
