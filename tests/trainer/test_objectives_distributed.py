"""GSPO and full REINFORCE++, on-policy distillation and DPO, on two FSDP2 ranks (gloo
on CPU) against one process.

REINFORCE++ normalises its per-token returns over the whole step's batch while
each rank holds only its rows, so the ranks sum their moments first; GSPO's
sequence ratio reduces over each trajectory's own tokens, packed or not. Two
steps, so that the second has a KL to the reference (the policy equals the
reference at the first) and a different plan per rank. Distillation: each rank loads
the teacher whole and scores its own rows; the metrics sum over the ranks. DPO: each
rank trains a slice of every mini-batch of pairs (here one pair on rank 0 and two on
rank 1, so rank 0 runs an empty micro-batch to keep FSDP's collectives in step).
"""

import math
import shutil

import pytest
import torch

from fp32 import SAME_MATH
from temper.config.distill import DistillConfig
from temper.config.dpo import DPOConfig
from temper.config.schema import AlgoConfig, TrainerConfig
from temper.models import load_model, resolve_model_path
from temper.records import Trajectory
from temper.trainer.distributed import DistributedTrainer
from temper.trainer.policy_trainer import PolicyTrainer
from temper.trainer.preference import ResponsePair, pair_rows

# lr and tolerance as tests/trainer/test_distributed.py (Adam amplifies rounding by lr).
CFG = TrainerConfig(lr=2e-5, warmup_steps=3, micro_batch_tokens=48, mini_batches=2)
TOL = 1e-5


def _batch(seed: int, n: int = 9) -> list[Trajectory]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        resp = torch.randint(3, 600, (2 + (i * 5 + seed) % 9,), generator=g).tolist()
        mask = [1] * len(resp)
        if i % 3 == 0:  # a multi-turn episode: an observation in the middle
            mask[1:3] = [0] * len(mask[1:3])
        out.append(
            Trajectory(
                task_id=f"t{i // 3}",
                group_id=i // 3,
                prompt_ids=[1, 87, 85, 20 + i // 3, 30 + seed],
                response_ids=resp,
                loss_mask=mask,
                behaviour_logprobs=[-1.0] * len(resp),
                versions=[0] * len(resp),
                finish_reason="stop",
                advantage=float(torch.randn((), generator=g)),
            )
        )
    return out


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize("packing", [False])
def test_reinforce_pp_with_gspo_on_two_ranks_matches_one_process(packing):
    algo = AlgoConfig(advantage="reinforce_pp", reward_kl_coef=0.5, policy_loss="gspo")
    cfg = CFG.model_copy(update={"packing": packing})
    plain = PolicyTrainer(load_model("tiny"), cfg, algo, 4, pad_id=0, ref_model=load_model("tiny"))
    plain_batches = [_batch(1), _batch(2)]
    plain_stats = [plain.train_step(b) for b in plain_batches]
    dist = DistributedTrainer(
        load_model("tiny"), "tiny", cfg.model_copy(update={"world_size": 2}), algo, 4, 0,
        ref_path="tiny",
    )  # fmt: skip
    try:
        dist_batches = [_batch(1), _batch(2)]
        dist_stats = [dist.train_step(b) for b in dist_batches]
        dist_w = _weights(dist.model)
    finally:
        dist.close()
    plain_w = _weights(plain.model)
    assert max(float((plain_w[k] - dist_w[k]).abs().max()) for k in plain_w) < TOL
    assert plain_stats[1]["reward_kl"] != 0 and math.isfinite(plain_stats[1]["reward_kl"])
    for mine, theirs in zip(plain_stats, dist_stats, strict=True):
        for key in ("loss", "reward_kl", "seq_ratio_mean", "seq_clip_frac_high", "grad_norm"):
            assert theirs[key] == pytest.approx(mine[key], rel=1e-4, abs=1e-6), key
    for a, b in zip(plain_batches[1], dist_batches[1], strict=True):
        torch.testing.assert_close(
            torch.tensor(b.trainer_logprobs), torch.tensor(a.trainer_logprobs), **SAME_MATH
        )


@pytest.mark.slow
def test_distillation_on_two_ranks_matches_one_process(tmp_path):
    """A teacher in the trainer (the tiny model at temperature 1/2, saved as a model
    directory), half its weight on the task reward's group advantage."""
    teacher_dir = tmp_path / "sharp"
    shutil.copytree(resolve_model_path("tiny"), teacher_dir)
    sharp = load_model(teacher_dir)
    with torch.no_grad():
        sharp.model.norm.weight.mul_(2)  # doubles every logit
    sharp.save_pretrained(teacher_dir)
    algo = AlgoConfig(advantage="distill")
    distill = DistillConfig(teacher=str(teacher_dir), reward_weight=0.5)
    plain = PolicyTrainer(
        load_model("tiny"), CFG, algo, 4, 0, teacher=load_model(teacher_dir), distill=distill
    )
    plain_stats = [plain.train_step(_batch(seed)) for seed in (1, 2)]
    dist = DistributedTrainer(
        load_model("tiny"), "tiny", CFG.model_copy(update={"world_size": 2}), algo, 4, 0,
        distill=distill, teacher_path=str(teacher_dir),
    )  # fmt: skip
    try:
        dist_stats = [dist.train_step(_batch(seed)) for seed in (1, 2)]
        dist_w = _weights(dist.model)
    finally:
        dist.close()
    plain_w = _weights(plain.model)
    assert max(float((plain_w[k] - dist_w[k]).abs().max()) for k in plain_w) < TOL
    # The sharpened teacher is no copy of the student: its scores move the advantages.
    assert (
        abs(plain_stats[0]["distill_teacher_logprob"] - plain_stats[0]["distill_student_logprob"])
        > 0.1
    )
    for mine, theirs in zip(plain_stats, dist_stats, strict=True):
        for key in ("loss", "grad_norm", "distill_reverse_kl", "distill_teacher_logprob"):
            assert theirs[key] == pytest.approx(mine[key], rel=1e-4, abs=1e-6), key


def _pairs(seed: int) -> list[ResponsePair]:
    """Six pairs: the first two trajectories of each of _batch's groups (same prompt)."""
    out = []
    for s in (seed, seed + 10):
        trajs = _batch(s)
        out += [ResponsePair(trajs[3 * g], trajs[3 * g + 1]) for g in range(3)]
    return out


@pytest.mark.slow
def test_dpo_on_two_ranks_matches_one_process():
    cfg = CFG.model_copy(update={"micro_batch_tokens": 24})  # about one pair a micro-batch
    dpo = DPOConfig(beta=0.5)
    plain = PolicyTrainer(load_model("tiny"), cfg, AlgoConfig(), 4, 0, dpo=dpo)
    batches = [_pairs(1), _pairs(2)]
    refs = [plain.sequence_logprobs(pair_rows(b)) for b in batches]  # the policy at the start
    for batch, sums in zip(batches, refs, strict=True):
        for k, p in enumerate(batch):
            p.ref_chosen, p.ref_rejected = sums[2 * k], sums[2 * k + 1]
    plain_stats = [plain.train_pairs(b) for b in batches]
    dist = DistributedTrainer(
        load_model("tiny"), "tiny", cfg.model_copy(update={"world_size": 2}), AlgoConfig(), 4, 0,
        ref_path="tiny", dpo=dpo,
    )  # fmt: skip
    try:
        assert dist.abilities.preference
        rows = pair_rows(batches[0])
        assert dist.sequence_logprobs(rows) == pytest.approx(refs[0], rel=1e-5)
        dist_stats = [dist.train_pairs(b) for b in batches]
        assert dist.sequence_logprobs(rows, reference=True) == pytest.approx(refs[0], rel=1e-5)
        dist_w = _weights(dist.model)
    finally:
        dist.close()
    plain_w = _weights(plain.model)
    assert max(float((plain_w[k] - dist_w[k]).abs().max()) for k in plain_w) < TOL
    assert plain_stats[1]["dpo/margin"] > 0.01  # the second step trains on moved weights
    for mine, theirs in zip(plain_stats, dist_stats, strict=True):
        for key in ("loss", "grad_norm", "dpo/margin", "dpo/reward_accuracy", "dpo/kl"):
            assert theirs[key] == pytest.approx(mine[key], rel=1e-4, abs=1e-6), key
