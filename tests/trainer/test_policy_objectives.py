"""GSPO, CISPO and full REINFORCE++ in the trainer: packed equals unpacked, every
objective runs with every off-policy correction, and REINFORCE++'s KL-in-reward."""

import copy
import math
import random

import pytest
import torch
from tests.trainer.loss_grads import summed_loss_and_grads

from fp32 import SAME_MATH
from temper.config.schema import AlgoConfig, TrainerConfig
from temper.models import load_model
from temper.records import Trajectory
from temper.trainer.policy_trainer import PolicyTrainer

OBJECTIVES = {
    "gspo": {"policy_loss": "gspo"},
    "cispo": {"policy_loss": "cispo"},
    "reinforce_pp": {"advantage": "reinforce_pp", "reward_kl_coef": 0.5},
    "reinforce_pp+gspo": {
        "advantage": "reinforce_pp",
        "reward_kl_coef": 0.5,
        "policy_loss": "gspo",
    },
}


def _traj(prompt, n, rng, multi_turn=False, adv=0.0):
    mask, sampled = [], True
    while multi_turn and len(mask) < n:  # sampled turns with observations between them
        mask += [int(sampled)] * min(n - len(mask), rng.randint(2, 6))
        sampled = not sampled
    resp = [rng.randint(3, 700) for _ in range(n)]
    return Trajectory(
        task_id="t",
        group_id=0,
        prompt_ids=list(prompt),
        response_ids=resp,
        loss_mask=mask or [1] * n,
        behaviour_logprobs=[-(k % 5) / 2 for k in range(n)],
        versions=[0] * n,
        finish_reason="stop",
        advantage=adv,
    )


def _small_batch(seed=0):
    """Six short trajectories in two groups, one of them multi-turn."""
    rng = random.Random(seed)
    p1, p2 = [rng.randint(3, 700) for _ in range(4)], [rng.randint(3, 700) for _ in range(3)]
    out = [_traj(p1, n, rng, True, rng.uniform(-1, 1)) for n in (9, 6, 7)]
    return out + [_traj(p2, n, rng, False, rng.uniform(-1, 1)) for n in (5, 3, 8)]


def _near_policy_behaviour(trainer, trajs, seed=0):
    """Behaviour logprobs as an engine's would be: the trainer's, plus a little noise."""
    g = torch.Generator().manual_seed(seed)
    lps = trainer._logprobs_no_grad(trainer.model, trajs)
    for i, t in enumerate(trajs):
        noise = torch.randn(len(t.response_ids), generator=g) * 0.05
        t.behaviour_logprobs = (lps[i][: len(t.response_ids)] + noise).tolist()


def _perturbed(model, seed=0, scale=0.05):
    """A copy of ``model`` with noise on its weights: a reference the policy differs from."""
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return ref


def _trainer(cfg, algo):
    model = load_model("tiny")
    ref = _perturbed(model) if algo.uses_reference else None
    return PolicyTrainer(model, cfg, algo, 1, pad_id=0, ref_model=ref)


def _loss_grads(trajs, cfg, algo):
    """Summed micro-batch losses, gradients and stats before any optimizer step."""
    trainer = _trainer(cfg, algo)
    rows = list(range(len(trajs)))
    token_adv = old = None
    if algo.advantage == "reinforce_pp":
        old = trainer._logprobs_no_grad(trainer.model, trajs)
        ref = trainer._logprobs_no_grad(trainer.ref_model, trajs)
        token_adv, _ = trainer._reinforce_pp_advantages(trajs, rows, old, ref)
    loss, grads, _, plan = summed_loss_and_grads(trainer, trajs, old, token_adv)
    return loss, grads, len(plan), token_adv


@pytest.mark.parametrize(
    ("name", "loss_agg"),
    [
        ("gspo", "seq-mean-token-mean"),
        ("gspo", "seq-mean-token-sum"),
        ("cispo", "token-mean"),
        ("reinforce_pp+gspo", "token-mean"),
    ],
)
def test_packed_loss_and_gradients_equal_the_unpacked_ones(name, loss_agg):
    """A sequence-level ratio (GSPO) reduces over each trajectory's own tokens, also
    when its group is cut over several packed rows."""
    algo = AlgoConfig(loss_agg=loss_agg, **OBJECTIVES[name])
    cfg = TrainerConfig(micro_batch_tokens=16)
    base = _small_batch()
    packed = cfg.model_copy(update={"packing": True})
    # 16 tokens a row: the multi-turn group (prompt 4, episodes 9, 6, 7) is cut over rows.
    plan = _trainer(packed, AlgoConfig())._plan(base)
    multi_turn = {i for i, t in enumerate(base) if 0 in t.loss_mask}
    assert sum(1 for rows in plan if multi_turn & set(rows)) > 1
    loss_p, grads_p, _, adv_p = _loss_grads(copy.deepcopy(base), packed, algo)
    loss_u, grads_u, _, adv_u = _loss_grads(copy.deepcopy(base), cfg, algo)
    assert math.isfinite(loss_p)
    # With REINFORCE++'s batch-normalised advantages the on-policy loss is 0 but for
    # rounding (terms of order 1 summed, e.g. +6e-8 against -6e-8): compare it at the
    # fp32 floor of such sums; the gradients, which are not 0, carry the test.
    assert loss_p == pytest.approx(loss_u, rel=1e-5, abs=1e-5)
    assert any(float(g.norm()) > 1e-6 for g in grads_u.values())
    for pname, g in grads_u.items():
        rel = float((grads_p[pname] - g).norm() / g.norm().clamp(min=1e-12))
        assert rel < 1e-5, (pname, rel)
    if adv_u is not None:  # REINFORCE++: per-token advantages, the same either way
        for i, a in adv_u.items():
            torch.testing.assert_close(adv_p[i], a, **SAME_MATH)


@pytest.mark.parametrize("correction", ["none", "behaviour", "tis", "mis", "decoupled"])
@pytest.mark.parametrize("name", ["gspo", "cispo", "reinforce_pp"])
def test_every_objective_trains_with_every_off_policy_correction(name, correction):
    algo = AlgoConfig(off_policy_correction=correction, is_low=0.5, **OBJECTIVES[name])
    trainer = _trainer(TrainerConfig(lr=1e-3, warmup_steps=0), algo)
    trajs = _small_batch(1)
    _near_policy_behaviour(trainer, trajs)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    stats = trainer.train_step(trajs)
    assert math.isfinite(stats["loss"]) and stats["grad_norm"] > 0
    params = trainer.model.named_parameters()
    moved = max(float((p.detach() - before[n]).abs().max()) for n, p in params)
    assert moved > 0
    own = {
        "gspo": ["seq_clip_frac_low", "seq_clip_frac_high", "seq_ratio_mean", "seq_ratio_max"],
        "cispo": ["cispo_clip_frac_low", "cispo_clip_frac_high", "cispo_weight_mean"],
        "reinforce_pp": ["reward_kl", "clip_frac_low", "clip_frac_high"],
    }[name]
    assert all(math.isfinite(stats[key]) for key in own), stats
    if correction in ("tis", "mis", "decoupled"):
        assert "is_weight_mean" in stats


def test_gspo_logs_the_sequences_its_tight_clip_silences():
    """After the first optimizer step (of two mini-batches) the second mini-batch sees
    sequence ratios past the paper's 3e-4 / 4e-4 band: GSPO logs its own sequence stats
    (not PPO's token clip fractions) and they show the silenced sequences."""
    algo = AlgoConfig(policy_loss="gspo")
    trainer = _trainer(TrainerConfig(lr=2e-5, warmup_steps=0, mini_batches=2), algo)
    stats = trainer.train_step(_small_batch(2))
    assert stats["seq_ratio_max"] > 1 + 4e-4
    assert stats["seq_clip_frac_low"] + stats["seq_clip_frac_high"] > 0
    assert "clip_frac_low" not in stats and "clip_frac_high" not in stats


def test_reinforce_pp_kl_in_the_reward_gives_per_token_advantages_and_the_update_follows():
    """All outcome rewards equal: a group baseline gives zero advantage everywhere, but
    REINFORCE++'s per-token KL penalty (k1 of the policy against the reference) still
    gives per-token advantages, and the step ascends sum_t A_t * logp_t."""
    trajs = _small_batch(3)
    for t in trajs:
        t.advantage = 1.0  # what compute_advantages("reinforce_pp") leaves: the reward
    algo = AlgoConfig(advantage="reinforce_pp", reward_kl_coef=0.5, reward_kl_estimator="k1")
    trainer = _trainer(TrainerConfig(lr=1e-4, warmup_steps=0), algo)
    rows = list(range(len(trajs)))
    old = trainer._logprobs_no_grad(trainer.model, trajs)
    ref = trainer._logprobs_no_grad(trainer.ref_model, trajs)
    adv, _ = trainer._reinforce_pp_advantages(trajs, rows, old, ref)
    kl_terms = [
        float(old[i][k] - ref[i][k])
        for i, t in enumerate(trajs)
        for k in range(len(t.response_ids))
        if t.loss_mask[k]
    ]

    def objective(lps):
        return sum(
            float((adv[i] * lps[i][: len(t.response_ids)]).sum()) for i, t in enumerate(trajs)
        )

    # A sequence's first policy token carries the KL of all its tokens: not constant.
    assert float(torch.cat(list(adv.values())).std()) > 0.5
    before = objective(old)
    stats = trainer.train_step(trajs)
    assert stats["reward_kl"] == pytest.approx(sum(kl_terms) / len(kl_terms), rel=1e-4)
    assert objective(trainer._logprobs_no_grad(trainer.model, trajs)) > before
    # Without the KL term the same batch has one return everywhere: no advantage, no update.
    flat = _trainer(TrainerConfig(lr=1e-4, warmup_steps=0), AlgoConfig(advantage="reinforce_pp"))
    assert flat.train_step(trajs)["grad_norm"] == 0
