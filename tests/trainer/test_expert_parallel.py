"""Expert parallelism (``trainer.ep``) on the built-in tiny MoE, against one process.

FSDP2 x EP on two gloo ranks: each holds two of every layer's four experts and
tokens are dispatched to them by all-to-all. Two steps must equal the
one-process steps within 1e-5, and a DCP checkpoint written by the two ranks
resumes in one process. The router's load-balance metrics are logged.
"""

import pytest
from tests.trainer.test_distributed import CFG, TOL, TOTAL_STEPS, _batch, _max_diff, _weights

from temper.config.algo import AlgoConfig
from temper.config.trainer import TrainerConfig
from temper.errors import ConfigError
from temper.models import load_model, load_tokenizer
from temper.trainer.checkpoint import load_checkpoint_state, save_checkpoint
from temper.trainer.distributed import DistributedTrainer
from temper.trainer.expert_parallel import expert_modules
from temper.trainer.policy_trainer import PolicyTrainer

pytestmark = pytest.mark.slow
MOE = "tiny-moe"


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    r: dict = {}
    plain = PolicyTrainer(load_model(MOE), CFG, AlgoConfig(), TOTAL_STEPS, pad_id=0)
    r["plain_stats1"] = plain.train_step(_batch(1))
    r["plain_w1"] = _weights(plain.model)
    r["plain_stats2"] = plain.train_step(_batch(2))
    r["plain_w2"] = _weights(plain.model)
    cfg = CFG.model_copy(update={"world_size": 2, "ep": 2})
    ep = DistributedTrainer(load_model(MOE), MOE, cfg, AlgoConfig(), TOTAL_STEPS, 0)
    try:
        r["ep_stats1"] = ep.train_step(_batch(1))
        r["ep_w1"] = _weights(ep.model)
        ckpt = save_checkpoint(
            tmp_path_factory.mktemp("ep"), 1, ep.model, load_tokenizer(MOE), ep.state_dict(),
            {"version": 1}, keep=1, write_extra=ep.write_sharded_state,
        )  # fmt: skip
        r["ep_stats2"] = ep.train_step(_batch(2))
        r["ep_w2"] = _weights(ep.model)
    finally:
        ep.close()
    one = PolicyTrainer(load_model(str(ckpt)), CFG, AlgoConfig(), TOTAL_STEPS, pad_id=0)
    one.load_checkpoint(ckpt, load_checkpoint_state(ckpt)[1])
    one.train_step(_batch(2))
    r["to_one_w2"] = _weights(one.model)
    return r


def test_the_tiny_moe_is_a_real_moe():
    model = load_model(MOE)
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert [m.num_experts for m in expert_modules(model)] == [4, 4]


@pytest.mark.parametrize("step", [1, 2])
def test_fsdp2_x_ep_matches_one_process(scenario, step):
    assert _max_diff(scenario[f"plain_w{step}"], scenario[f"ep_w{step}"]) < TOL
    for key, value in scenario[f"plain_stats{step}"].items():
        # The load metric counts every position the routers saw, padding included, and
        # the ranks pad differently from one process: close, not equal.
        rel = 0.01 if key.startswith("moe_") else 1e-5
        assert scenario[f"ep_stats{step}"][key] == pytest.approx(value, rel=rel, abs=1e-6), key


def test_the_update_is_not_vacuous(scenario):
    shipped = _weights(load_model(MOE))
    assert _max_diff(shipped, scenario["plain_w2"]) > 2 * TOL
    assert scenario["plain_stats1"]["grad_norm"] > 0


def test_an_ep_checkpoint_resumes_in_one_process(scenario):
    assert _max_diff(scenario["plain_w2"], scenario["to_one_w2"]) < TOL


def test_load_balance_metrics(scenario):
    stats = scenario["plain_stats1"]
    assert stats["moe_load_max_over_mean"] >= 1.0 and stats["moe_dropped_tokens"] == 0.0


def test_ep_on_a_dense_model_is_one_config_error():
    cfg = CFG.model_copy(update={"world_size": 2, "ep": 2})
    with pytest.raises(ConfigError, match="expert parallelism needs an MoE model"):
        DistributedTrainer(load_model("tiny"), "tiny", cfg, AlgoConfig(), TOTAL_STEPS, 0)


def test_ep_must_be_the_fsdp_ranks():
    with pytest.raises(ValueError, match=r"trainer\.ep = 2 needs trainer\.tp = 1"):
        TrainerConfig(world_size=4, ep=2)
