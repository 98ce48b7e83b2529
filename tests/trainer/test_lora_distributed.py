"""LoRA over FSDP2: two ranks (gloo on CPU) train the same adapters as one process,
hand back and checkpoint only the adapters, and resume across world sizes.

Every rank starts from the parent's random adapters (`WorkerSpec.lora_init`); with
different ones the shards of a rank-1 A would mix two initialisations.
"""

import copy
import json

import pytest
import torch
import torch.distributed.checkpoint as dcp

from quick_run import LORA_RUN, metrics, train
from temper.config.lora import LoraConfig
from temper.config.schema import AlgoConfig, TrainerConfig
from temper.models import load_model
from temper.records import Trajectory
from temper.trainer.checkpoint import DCP_DIR
from temper.trainer.distributed import DistributedTrainer
from temper.trainer.lora import ADAPTER_WEIGHTS, LoraAdapter
from temper.trainer.policy_trainer import PolicyTrainer
from temper.weights.adapter import LORA_A, LORA_B

# lr 10x tests/trainer/test_distributed.py's (LoRA's rate); Adam amplifies rounding by lr.
CFG = TrainerConfig(lr=2e-4, warmup_steps=3, micro_batch_tokens=48, mini_batches=2)
LORA = LoraConfig(rank=4)
TOL = 1e-5


def _batch(seed: int, n: int = 9) -> list[Trajectory]:
    g = torch.Generator().manual_seed(seed)
    return [
        Trajectory(
            task_id=f"t{i // 3}",
            group_id=i // 3,
            prompt_ids=[1, 87, 85, 20 + i // 3, 30 + seed],
            response_ids=(resp := torch.randint(3, 600, (2 + (i * 5 + seed) % 9,), generator=g)
                          .tolist()),
            loss_mask=[1] * len(resp),
            behaviour_logprobs=[-1.0] * len(resp),
            versions=[0] * len(resp),
            finish_reason="stop",
            advantage=float(torch.randn((), generator=g)),
        )
        for i in range(n)
    ]  # fmt: skip


def _plain(seed: int) -> PolicyTrainer:
    torch.manual_seed(seed)  # the adapters' random A
    model = load_model("tiny")
    return PolicyTrainer(model, CFG, AlgoConfig(), 6, 0, adapter=LoraAdapter.wrap(model, LORA))


def _gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _save(trainer, ckpt) -> dict:
    trainer.saved_model().save_pretrained(str(ckpt), safe_serialization=True)
    if trainer.abilities.sharded_state:
        trainer.write_sharded_state(ckpt)
    return copy.deepcopy(trainer.state_dict())  # AdamW's live moments: the next step moves them


@pytest.mark.slow
def test_two_ranks_train_the_adapters_of_one_process_and_resume_across_world_sizes(tmp_path):
    plain = _plain(seed=0)
    plain_stats = [plain.train_step(_batch(s)) for s in (1, 2)]
    plain_state = _save(plain, tmp_path / "plain")
    plain.train_step(_batch(3))
    torch.manual_seed(0)
    dist = DistributedTrainer(
        load_model("tiny"), "tiny", CFG.model_copy(update={"world_size": 2}), AlgoConfig(), 6, 0,
        lora=LORA,
    )  # fmt: skip
    try:
        assert dist.abilities.adapter and dist.abilities.sharded_state
        dist_stats = [dist.train_step(_batch(s)) for s in (1, 2)]
        update = dist.engine_state_dict()
        assert update.keys() == plain.engine_state_dict().keys()
        assert all(k.endswith((LORA_A, LORA_B)) for k in update)
        dist_state = _save(dist, tmp_path / "dist")
        # A world-size-1 checkpoint of the same two steps, loaded by the two ranks.
        dist.load_checkpoint(tmp_path / "plain", plain_state)
        dist.train_step(_batch(3))
        after_plain_ckpt = dist.engine_state_dict()
        base = {k: v for k, v in dist.model.state_dict().items() if "lora_" not in k}
    finally:
        dist.close()
    for mine, theirs in zip(plain_stats, dist_stats, strict=True):
        for key in ("loss", "grad_norm"):
            assert theirs[key] == pytest.approx(mine[key], rel=1e-4, abs=1e-6), key
    assert _gap(after_plain_ckpt, plain.engine_state_dict()) < TOL
    # The adapters moved; the base did not (names as peft's base_layer holds them).
    b = next(v for k, v in plain.engine_state_dict().items() if k.endswith(LORA_B))
    assert float(b.abs().max()) > 100 * TOL
    tiny = load_model("tiny").state_dict()
    for name, tensor in base.items():
        torch.testing.assert_close(tensor, tiny[name.replace(".base_layer", "")], rtol=0, atol=0)

    # The ranks' DCP shards hold the adapters and their AdamW moments, not the base.
    saved = dcp.FileSystemReader(str(tmp_path / "dist" / DCP_DIR)).read_metadata()
    model_keys = [k for k in saved.state_dict_metadata if k.startswith("model.")]
    assert model_keys and [k for k in model_keys if "lora_" not in k] == []
    assert (tmp_path / "dist" / ADAPTER_WEIGHTS).is_file()
    # ... and load in one process (other random A first), to the same third step.
    resumed = _plain(seed=1)
    resumed.load_checkpoint(tmp_path / "dist", dist_state)
    resumed.train_step(_batch(3))
    assert _gap(resumed.engine_state_dict(), plain.engine_state_dict()) < TOL


RUN = (*LORA_RUN, "--eval.every=0", "--eval.at_start=false")


@pytest.mark.slow
def test_a_two_rank_lora_run_updates_the_engine_and_checkpoints_the_adapter(tmp_path):
    run = train(
        tmp_path, "ws2", *RUN, "--orchestrator.steps=2", "--trainer.world_size=2",
        "--checkpoint.at_end=true",
    )  # fmt: skip
    steps = metrics(run)
    assert [m["step"] for m in steps] == [1, 2]
    # Step 2 sampled on the engine after the first adapter update: the ranks' logprobs
    # of those samples match the engine's.
    assert steps[1]["train_infer_logprob_diff"] < 1e-3
    ckpt = run / "checkpoints" / "step_2"
    assert (ckpt / ADAPTER_WEIGHTS).is_file() and (ckpt / DCP_DIR).is_dir()
    assert not list(ckpt.glob("model*.safetensors"))  # the base stays in model.path
    assert json.loads((ckpt / "adapter_config.json").read_text())["r"] == 2
    # (A resume of these shards in one process: the test above; the engines' adapter
    # after a resume: tests/trainer/test_lora.py.)
