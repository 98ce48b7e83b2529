"""A short tiny run with trainer.world_size=2 (FSDP2 ranks, gloo) matches world_size=1."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from quick_run import metrics, train

COMMON = [
    "--orchestrator.steps=2",
    "--orchestrator.prompts_per_step=2",
    "--orchestrator.group_size=4",
    "--orchestrator.drop_zero_variance_groups=false",
    "--trainer.lr=2e-5",
    "--trainer.warmup_steps=0",
    "--checkpoint.at_end=true",
]


def _run(root: Path, name: str, *extra: str) -> Path:
    return train(root, name, *COMMON, *extra)


@pytest.mark.slow
def test_world_size_two_run_matches_world_size_one(tmp_path):
    one = _run(tmp_path, "one")
    two = _run(tmp_path, "two", "--trainer.world_size=2")
    m1, m2 = metrics(one), metrics(two)
    assert [m["step"] for m in m2] == [1, 2]
    # Step 1 samples from the same shipped weights: same batch, same update.
    for key in ("reward_mean", "tokens_generated", "train_tokens"):
        assert m2[0][key] == m1[0][key], key
    for key in ("loss", "grad_norm", "entropy", "train_infer_logprob_diff"):
        assert m2[0][key] == pytest.approx(m1[0][key], rel=1e-4, abs=1e-6), key
    assert all(m["policy_version"] == m["step"] for m in m2)  # the engine got each update
    # The final checkpoints: same weights; the world-size-2 one also holds the DCP shards.
    ckpt1, ckpt2 = one / "checkpoints" / "step_2", two / "checkpoints" / "step_2"
    w1, w2 = (
        load_file(str(ckpt1 / "model.safetensors")),
        load_file(str(ckpt2 / "model.safetensors")),
    )
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-4
    assert len(list((ckpt2 / "dcp").glob("*.distcp"))) == 2
    assert torch.load(ckpt2 / "trainer.pt", weights_only=False)["format"] == "dcp"


DPO = [
    "--trainer.mode=dpo",
    "--orchestrator.steps=2",
    "--orchestrator.prompts_per_step=8",
    "--dpo.size=16",
    "--dpo.eval_size=16",
    "--trainer.lr=3e-4",
    "--trainer.warmup_steps=0",
    "--eval.size=4",
    "--eval.k=1",
    "--eval.at_end=true",
    "--checkpoint.keep_best=false",
]


@pytest.mark.slow
def test_a_dataset_dpo_run_on_two_ranks_matches_one_process(tmp_path):
    one = train(tmp_path, "dpo1", *DPO)
    two = train(tmp_path, "dpo2", *DPO, "--trainer.world_size=2")
    m1, m2 = metrics(one), metrics(two)
    assert [m["step"] for m in m2] == [1, 2]
    # The reference logprobs came from the ranks too: step 1's loss is log 2 on both.
    # (Not reward_accuracy: at the reference every margin is 0 up to rounding.)
    for a, b in zip(m1, m2, strict=True):
        for key in ("dpo/loss", "dpo/margin", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    e1 = json.loads((one / "eval" / "step_000002.json").read_text())
    e2 = json.loads((two / "eval" / "step_000002.json").read_text())
    assert e2["preference_margin"] == pytest.approx(e1["preference_margin"], rel=1e-3)
    assert e2["preference_margin"] > 0  # two steps moved it off the reference's ties
