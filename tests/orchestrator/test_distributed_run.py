"""A short tiny run with trainer.world_size=2 (FSDP2 ranks, gloo) matches world_size=1."""

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
