"""GSPO and full REINFORCE++ on two FSDP2 ranks (gloo on CPU) against one process.

REINFORCE++ normalises its per-token returns over the whole step's batch while
each rank holds only its rows, so the ranks sum their moments first; GSPO's
sequence ratio reduces over each trajectory's own tokens, packed or not. Two
steps, so that the second has a KL to the reference (the policy equals the
reference at the first) and a different plan per rank.
"""

import math

import pytest
import torch

from fp32 import SAME_MATH
from temper.config.schema import AlgoConfig, TrainerConfig
from temper.models import load_model
from temper.records import Trajectory
from temper.trainer.distributed import DistributedTrainer
from temper.trainer.policy_trainer import PolicyTrainer

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
            mask[1:3] = [0, 0]
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
