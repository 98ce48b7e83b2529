"""Pipeline parallelism (``trainer.pp``) on gloo, against the one-process trainer.

One module-scoped scenario, beside a packed `PolicyTrainer`:
- TP2 x PP2 (four ranks, 1F1B) takes step 1 and writes a DCP checkpoint;
- that checkpoint resumes in one process and on PP2 (two ranks, GPipe) for step 2;
- the same PP2 ranks then load a one-process checkpoint and take step 2 again.
Every update must equal the one-process update within 1e-5 (fp32), with the
metrics. The built-in tiny model ties its embeddings, so the first and last
stages share a matrix: the comparison covers that path. The CFG's two
mini-batches make every step run the forward-only pipeline for the old
logprobs as well. (FSDP2 x PP2 and the 3-D layouts: `scripts/parallel_parity.py`.)
"""

import pytest
import torch
from tests.trainer.test_distributed import CFG, TOL, TOTAL_STEPS, _batch, _max_diff, _weights

from temper.config.schema import AlgoConfig, TrainerConfig
from temper.errors import ConfigError
from temper.models import load_model, load_tokenizer
from temper.records import Trajectory
from temper.trainer.checkpoint import load_checkpoint_state, save_checkpoint
from temper.trainer.distributed import DistributedTrainer
from temper.trainer.packing import collate_packed, packed_logits, pad_packed
from temper.trainer.pipeline import stage_layers
from temper.trainer.policy_trainer import PolicyTrainer

PACKED = CFG.model_copy(update={"packing": True})


def _dist(world_size: int, tp: int, pp: int, schedule: str) -> DistributedTrainer:
    cfg = PACKED.model_copy(
        update={"world_size": world_size, "tp": tp, "pp": pp, "pp_schedule": schedule}
    )
    return DistributedTrainer(load_model("tiny"), "tiny", cfg, AlgoConfig(), TOTAL_STEPS, 0)


def _save(root, trainer, write_extra=None):
    return save_checkpoint(
        root, 1, trainer.model, load_tokenizer("tiny"), trainer.state_dict(), {"version": 1},
        keep=1, write_extra=write_extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    r: dict = {}
    plain = PolicyTrainer(load_model("tiny"), PACKED, AlgoConfig(), TOTAL_STEPS, pad_id=0)
    r["batch1"] = _batch(1)
    r["plain_stats1"] = plain.train_step(r["batch1"])
    r["plain_w1"] = _weights(plain.model)
    plain_ckpt = _save(tmp_path_factory.mktemp("plain"), plain)
    r["plain_stats2"] = plain.train_step(_batch(2))
    r["plain_w2"] = _weights(plain.model)

    tp2pp2 = _dist(4, 2, 2, "1f1b")
    try:
        r["pp_batch1"] = _batch(1)
        r["tp2pp2_stats1"] = tp2pp2.train_step(r["pp_batch1"])
        r["tp2pp2_w1"] = _weights(tp2pp2.model)
        ckpt = _save(tmp_path_factory.mktemp("pp"), tp2pp2, tp2pp2.write_sharded_state)
    finally:
        tp2pp2.close()
    state = load_checkpoint_state(ckpt)[1]
    one = PolicyTrainer(load_model(str(ckpt)), PACKED, AlgoConfig(), TOTAL_STEPS, pad_id=0)
    one.load_checkpoint(ckpt, state)  # TP2 x PP2 -> one process
    one.train_step(_batch(2))
    r["to_one_w2"] = _weights(one.model)
    pp2 = _dist(2, 1, 2, "gpipe")
    try:
        pp2.load_checkpoint(ckpt, state)  # TP2 x PP2 -> PP2
        r["to_pp2_stats2"] = pp2.train_step(_batch(2))
        r["to_pp2_w2"] = _weights(pp2.model)
        pp2.load_checkpoint(plain_ckpt, load_checkpoint_state(plain_ckpt)[1])  # one -> PP2
        r["one_to_pp2_stats2"] = pp2.train_step(_batch(2))
        r["one_to_pp2_w2"] = _weights(pp2.model)
    finally:
        pp2.close()
    return r


def _same_metrics(want: dict[str, float], got: dict[str, float]) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


@pytest.mark.slow
def test_tp2_pp2_step_matches_one_process(scenario):
    assert _max_diff(scenario["plain_w1"], scenario["tp2pp2_w1"]) < TOL
    _same_metrics(scenario["plain_stats1"], scenario["tp2pp2_stats1"])
    # The last stage's ranks report the trainer logprobs of every row.
    for a, b in zip(scenario["batch1"], scenario["pp_batch1"], strict=True):
        assert b.trainer_logprobs is not None
        torch.testing.assert_close(
            torch.tensor(b.trainer_logprobs), torch.tensor(a.trainer_logprobs), atol=1e-5, rtol=0
        )


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["to_one", "to_pp2", "one_to_pp2"])
def test_a_checkpoint_resumes_across_pipeline_layouts(scenario, layout):
    assert _max_diff(scenario["plain_w2"], scenario[f"{layout}_w2"]) < TOL
    if f"{layout}_stats2" in scenario:
        _same_metrics(scenario["plain_stats2"], scenario[f"{layout}_stats2"])


@pytest.mark.slow
def test_the_comparisons_are_not_vacuous(scenario):
    shipped = _weights(load_model("tiny"))
    assert _max_diff(shipped, scenario["plain_w1"]) > 1.5 * TOL
    assert _max_diff(scenario["plain_w1"], scenario["plain_w2"]) > 1.5 * TOL
    assert scenario["plain_stats1"]["grad_norm"] > 0


def test_stages_split_the_layers_contiguously_and_whole():
    for layers, stages in ((4, 2), (4, 4), (7, 3), (24, 5)):
        parts = [stage_layers(layers, stages, s) for s in range(stages)]
        assert [i for part in parts for i in part] == list(range(layers))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def _trajectory(response: list[int]) -> Trajectory:
    n = len(response)
    return Trajectory(
        task_id="t", group_id=0, prompt_ids=[5, 6, 7], response_ids=response, loss_mask=[1] * n,
        behaviour_logprobs=[0.0] * n, versions=[0] * n, finish_reason="stop",
    )  # fmt: skip


def test_a_padded_packed_row_gives_the_same_logits():
    model = load_model("tiny").eval()
    trajs = [_trajectory(r) for r in ([8, 9, 10], [11, 12])]
    mb = collate_packed(trajs, [0, 1], pad_id=0)
    padded = pad_packed(mb, mb.input_ids.shape[1] + 5, pad_id=0)
    assert padded.input_ids.shape[1] == mb.input_ids.shape[1] + 5
    with torch.no_grad():
        torch.testing.assert_close(packed_logits(model, padded), packed_logits(model, mb))
    with pytest.raises(ValueError, match="does not fit"):
        pad_packed(mb, mb.input_ids.shape[1] - 1, pad_id=0)


def test_pipeline_config_errors_name_the_setting():
    with pytest.raises(ValueError, match=r"trainer\.pp = 2 trains packed rows"):
        TrainerConfig(world_size=2, pp=2)
    with pytest.raises(ValueError, match=r"not a multiple of trainer\.tp x trainer\.pp = 4"):
        TrainerConfig(world_size=6, tp=2, pp=2, packing=True)
    cfg = PACKED.model_copy(update={"world_size": 8, "pp": 8})
    with pytest.raises(ConfigError, match="8 is more stages than the model's 4 layers"):
        DistributedTrainer(load_model("tiny"), "tiny", cfg, AlgoConfig(), TOTAL_STEPS, 0)
    cfg = PACKED.model_copy(update={"world_size": 2, "pp": 2})
    with pytest.raises(ConfigError, match="reinforce_pp"):
        DistributedTrainer(
            load_model("tiny"), "tiny", cfg, AlgoConfig(advantage="reinforce_pp"), TOTAL_STEPS, 0
        )
