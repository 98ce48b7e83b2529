"""PPO's critic in the trainer: GAE targets from trajectories, values read where the
logits are, learning, warm-up, and an exact resume for both kinds of critic."""

import copy
import io
import random

import pytest
import torch

from fp32 import SAME_MATH
from temper.config.critic import CriticConfig
from temper.config.schema import AlgoConfig, TrainerConfig
from temper.models import load_model
from temper.records import Trajectory
from temper.trainer.critic import Critic, gae_targets
from temper.trainer.policy_trainer import PolicyTrainer


def _multi_turn(values_scale=1.0):
    """Turn 0 = tokens 0-1, an observation at 2-3, turn 1 = tokens 4-6; the env paid
    0.25 for turn 0 and the episode's reward is 1.0 (so turn 1 earned 0.75)."""
    return Trajectory(
        task_id="t",
        group_id=0,
        prompt_ids=[5, 6, 7],
        response_ids=[11, 12, 13, 14, 15, 16, 17],
        loss_mask=[1, 1, 0, 0, 1, 1, 1],
        behaviour_logprobs=[-1.0] * 7,
        versions=[0] * 7,
        finish_reason="stop",
        reward=1.0,
        num_turns=2,
        turn_spans=[(0, 2), (4, 7)],
        turn_rewards=[0.25],
    )


OLD_VALUES = {0: torch.tensor([0.1, 0.2, 9.0, 9.0, 0.3, 0.4, 0.5])}


def test_token_level_gae_targets_skip_observations():
    # gamma = lam = 1, reward 1.0 at the last policy token: A_t = 1 - V_t, R_t = 1.
    adv, ret, mask = gae_targets(AlgoConfig(advantage="gae"), [_multi_turn()], [0], OLD_VALUES)
    torch.testing.assert_close(adv[0], torch.tensor([0.9, 0.8, 0, 0, 0.7, 0.6, 0.5]), **SAME_MATH)
    torch.testing.assert_close(ret[0], torch.tensor([1.0, 1, 0, 0, 1, 1, 1]), **SAME_MATH)
    assert mask.tolist() == [[1, 1, 0, 0, 1, 1, 1]]


def test_turn_level_gae_targets_by_hand():
    # States at each turn's first token: V_0 = 0.1, V_1 = 0.3; rewards 0.25, 0.75;
    # gamma 0.5 (turn_discount), lam 1:
    # k=1: A = 0.75 - 0.3 = 0.45, R = 0.75
    # k=0: delta = 0.25 + 0.5 * 0.3 - 0.1 = 0.3; A = 0.3 + 0.5 * 0.45 = 0.525, R = 0.625
    algo = AlgoConfig(advantage="gae", credit="turn", turn_discount=0.5)
    adv, ret, _ = gae_targets(algo, [_multi_turn()], [0], OLD_VALUES)
    torch.testing.assert_close(
        adv[0], torch.tensor([0.525, 0.525, 0, 0, 0.45, 0.45, 0.45]), **SAME_MATH
    )
    torch.testing.assert_close(
        ret[0], torch.tensor([0.625, 0.625, 0, 0, 0.75, 0.75, 0.75]), **SAME_MATH
    )


def _batch(seed=0, n=6):
    rng = random.Random(seed)
    prompts = [[rng.randint(3, 700) for _ in range(4)] for _ in range(2)]
    out = []
    for k in range(n):
        length = rng.randint(4, 9)
        out.append(
            Trajectory(
                task_id="t",
                group_id=k % 2,
                prompt_ids=prompts[k % 2],
                response_ids=[rng.randint(3, 700) for _ in range(length)],
                loss_mask=[1] * length,
                behaviour_logprobs=[-3.0] * length,
                versions=[0] * length,
                finish_reason="stop",
                reward=float(k % 3 == 0),
            )
        )
    return out


def _ppo(kind="model", warmup=0, packing=False, clip=0.2, lr=5e-3, **algo_keys):
    cfg = TrainerConfig(lr=1e-3, warmup_steps=0, packing=packing, mini_batches=2, ppo_epochs=2)
    algo = AlgoConfig(advantage="gae", **algo_keys)
    critic_cfg = CriticConfig(kind=kind, warmup_steps=warmup, value_clip=clip, lr=lr)
    torch.manual_seed(0)
    model = load_model("tiny")
    value_model = load_model("tiny") if kind == "model" else None
    critic = Critic(critic_cfg, cfg, model, value_model, optimizer_steps=40)
    return PolicyTrainer(model, cfg, algo, 10, pad_id=0, critic=critic)


def _params(module):
    return {n: p.detach().clone() for n, p in module.state_dict().items()}


@pytest.mark.parametrize("kind", ["model", "head"])
def test_critic_learns_the_returns(kind):
    trainer = _ppo(kind)
    trajs = _batch()
    first = trainer.train_step(copy.deepcopy(trajs))
    for _ in range(6):
        last = trainer.train_step(copy.deepcopy(trajs))
    assert first["value_mean"] == 0.0  # a zero-initialised head: every value starts at 0
    assert last["value_loss"] < 0.5 * first["value_loss"], (first, last)
    assert last["explained_variance"] > first["explained_variance"]
    assert "loss" in last and last["critic_warmup"] == 0.0


@pytest.mark.parametrize("kind", ["model", "head"])
def test_warmup_trains_the_critic_alone(kind):
    trainer = _ppo(kind, warmup=1)
    policy0, critic0 = _params(trainer.model), _params(trainer.critic.module)
    m = trainer.train_step(_batch())
    assert m["critic_warmup"] == 1.0 and "loss" not in m
    assert all(torch.equal(policy0[n], p) for n, p in _params(trainer.model).items())
    assert any(not torch.equal(critic0[n], p) for n, p in _params(trainer.critic.module).items())
    m = trainer.train_step(_batch())
    assert m["critic_warmup"] == 0.0 and "loss" in m
    assert any(not torch.equal(policy0[n], p) for n, p in _params(trainer.model).items())


def test_head_values_are_the_head_on_the_last_hidden_state():
    trainer = _ppo("head")
    with torch.no_grad():
        trainer.critic.module.weight.normal_(0, 0.5)
        trainer.critic.module.bias.fill_(0.25)
    trajs = _batch()
    values = trainer.critic.values(trainer, trajs, list(range(len(trajs))))
    for i, t in enumerate(trajs):
        ids = torch.tensor([t.prompt_ids + t.response_ids])
        with torch.no_grad():
            hidden = trainer.model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
        # The value of response token j is read where its logits come from: one position back.
        states = hidden[0, len(t.prompt_ids) - 1 : -1]
        expected = trainer.critic.module(states)[:, 0]
        torch.testing.assert_close(values[i], expected, **SAME_MATH)


def test_value_model_reads_the_same_values_packed_or_not():
    plain, packed = _ppo("model"), _ppo("model", packing=True)
    trajs = _batch()
    plain.train_step(copy.deepcopy(trajs))  # move the head off zero
    packed.critic.module.load_state_dict(plain.critic.module.state_dict())
    rows = list(range(len(trajs)))
    a = plain.critic.values(plain, trajs, rows)
    b = packed.critic.values(packed, trajs, rows)
    assert any(float(v.abs().max()) > 1e-4 for v in a.values())
    for i in rows:
        torch.testing.assert_close(a[i], b[i], **SAME_MATH)


def _round_trip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("kind", ["model", "head"])
def test_resume_is_exact(kind):
    full = _ppo(kind, warmup=1)
    for seed in (1, 2, 3):
        full.train_step(_batch(seed))

    first = _ppo(kind, warmup=1)
    first.train_step(_batch(1))
    saved_policy, saved = _params(first.model), _round_trip(first.state_dict())
    resumed = _ppo(kind, warmup=1)
    resumed.model.load_state_dict(saved_policy)
    resumed.load_state_dict(saved)
    assert resumed.critic.steps == 1 and not resumed.critic.warming_up
    for seed in (2, 3):
        resumed.train_step(_batch(seed))
    for name, p in _params(full.model).items():
        assert torch.equal(p, _params(resumed.model)[name]), name
    for name, p in _params(full.critic.module).items():
        assert torch.equal(p, _params(resumed.critic.module)[name]), name


def test_a_checkpoint_of_another_kind_is_refused():
    state = _round_trip(_ppo("head").state_dict())
    with pytest.raises(ValueError, match=r"critic\.kind"):
        _ppo("model").load_state_dict(state)


@pytest.mark.parametrize("policy_loss", ["gspo", "cispo"])
def test_gae_advantages_drive_every_policy_objective(policy_loss):
    trainer = _ppo(policy_loss=policy_loss, off_policy_correction="tis")
    policy0 = _params(trainer.model)
    m = trainer.train_step(_batch())
    assert torch.isfinite(torch.tensor(m["loss"])) and m["grad_norm"] > 0
    assert any(not torch.equal(policy0[n], p) for n, p in _params(trainer.model).items())
