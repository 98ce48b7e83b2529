"""GSPO and CISPO losses and full REINFORCE++'s returns against hand-computed values."""

import math
import statistics

import pytest
import torch

from temper.algos import (
    aggregate_loss,
    cispo_loss,
    compute_advantages,
    gspo_loss,
    masked_moments,
    normalise_over_batch,
    ppo_clip_loss,
    reinforce_pp_token_returns,
)

# Row 0: token log-ratios 0.3, -0.3, 0.6 -> mean 0.2, s = e^0.2 (above the band).
# Row 1: log-ratios 1e-4, 1e-4 (third token masked) -> s = e^1e-4 (inside the band).
# Row 2: no policy tokens.
LOGP = [[-1.0, -2.0, -0.5], [-1.0, -1.0, -7.0], [-3.0, -3.0, -3.0]]
OLD = [[-1.3, -1.7, -1.1], [-1.0001, -1.0001, 5.0], [0.0, 0.0, 0.0]]
MASK = [[1, 1, 1], [1, 1, 0], [0, 0, 0]]
ADV = [1.0, -2.0, 5.0]


def _gspo(**kw):
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    loss, stats = gspo_loss(
        logp, torch.tensor(OLD, dtype=torch.float64), torch.tensor(ADV, dtype=torch.float64),
        torch.tensor(MASK), **kw,
    )  # fmt: skip
    return logp, loss, stats


def test_gspo_sequence_ratio_and_clip_by_hand():
    logp, loss, stats = _gspo()
    s0, s1 = math.exp(0.2), math.exp(1e-4)
    # Row 0: A > 0 and s0 > 1 + 4e-4, so the clipped term -(1 + 4e-4) * A wins.
    # Row 1: s1 inside [1 - 3e-4, 1 + 4e-4]: loss -s1 * A = 2 * s1 on each policy token.
    expected = [[-(1 + 4e-4)] * 3, [2 * s1, 2 * s1, 0.0], [0.0] * 3]
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float64))
    assert stats["seq_ratio_mean"].item() == pytest.approx((s0 + s1) / 2)
    assert stats["seq_ratio_max"].item() == pytest.approx(s0)
    assert stats["seq_ratio_min"].item() == pytest.approx(s1)
    assert stats["seq_clip_frac_high"].item() == pytest.approx(0.5)  # row 0 of the two
    assert stats["seq_clip_frac_low"].item() == 0.0
    # seq-mean-token-mean (the paper's objective): (L0 + L1) / 2 with L_i a sequence's loss.
    total = aggregate_loss(loss, torch.tensor(MASK), "seq-mean-token-mean")
    total.backward()
    assert total.item() == pytest.approx((-(1 + 4e-4) + 2 * s1) / 2)
    # The clipped sequence gets no gradient; a token of row 1 gets (1/2)(1/2)(-A s1) = s1/2.
    expected_grad = [[0.0] * 3, [s1 / 2, s1 / 2, 0.0], [0.0] * 3]
    torch.testing.assert_close(logp.grad, torch.tensor(expected_grad, dtype=torch.float64))


def test_gspo_token_form_has_the_sequence_objectives_gradient():
    """The token form (sg(s_i) * pi_t / sg(pi_t)) gives GSPO's own gradient, written
    directly as -min(s_i A_i, clip(s_i) A_i) with s_i differentiated through the mean."""
    kw = {"clip_low": 0.5, "clip_high": 0.5}  # wide: both sequences inside the band
    logp, loss, _ = _gspo(**kw)
    aggregate_loss(loss, torch.tensor(MASK), "seq-mean-token-mean").backward()
    direct = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor(MASK, dtype=torch.float64)
    log_r = (direct - torch.tensor(OLD, dtype=torch.float64)) * mask
    s = torch.exp(log_r.sum(-1) / mask.sum(-1).clamp(min=1))
    adv = torch.tensor(ADV, dtype=torch.float64)
    per_seq = -torch.minimum(s * adv, s.clamp(0.5, 1.5) * adv)
    (per_seq[:2].sum() / 2).backward()  # the two sequences with policy tokens
    torch.testing.assert_close(logp.grad, direct.grad)


def test_gspo_gives_the_same_value_to_every_token_of_a_sequence_unlike_ppo():
    _, loss, _ = _gspo(clip_low=0.5, clip_high=0.5)
    ppo, _ = ppo_clip_loss(
        torch.tensor(LOGP, dtype=torch.float64), torch.tensor(OLD, dtype=torch.float64),
        torch.tensor(ADV, dtype=torch.float64), torch.tensor(MASK), 0.5, 0.5,
    )  # fmt: skip
    assert torch.allclose(loss[0], loss[0, :1].expand(3))
    assert not torch.allclose(ppo[0], ppo[0, :1].expand(3))


def test_gspo_refuses_a_lower_bound_of_one_or_more():
    with pytest.raises(ValueError, match="clip_low < 1"):
        _gspo(clip_low=1.0)


def test_cispo_weights_and_every_token_keeps_its_gradient():
    # r = e^0.5 (above 1.28), 1, e^-1 (below 0.8), e^-0.1; last token masked.
    logp = torch.tensor([[-1.0, -2.0, -0.5, -0.3, -4.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0, 0.5, -0.2, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    adv = torch.tensor([2.0])
    loss, stats = cispo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    w = [1.28, 1.0, 0.8, math.exp(-0.1)]
    lp = [-1.0, -2.0, -0.5, -0.3]
    expected = [-wi * 2.0 * li for wi, li in zip(w, lp, strict=True)] + [0.0]
    torch.testing.assert_close(loss, torch.tensor([expected]))
    loss.sum().backward()
    # d loss / d logp_t = -w_t * A: non-zero on every policy token, the two clipped included.
    torch.testing.assert_close(logp.grad, torch.tensor([[-2.0 * wi for wi in w] + [0.0]]))
    assert stats["cispo_clip_frac_high"].item() == pytest.approx(1 / 4)
    assert stats["cispo_clip_frac_low"].item() == pytest.approx(1 / 4)
    assert stats["cispo_weight_mean"].item() == pytest.approx(sum(w) / 4)
    assert stats["ratio_max"].item() == pytest.approx(math.exp(0.5))
    # PPO on the same tokens zeroes the gradient of the token above its band (A > 0).
    ppo_logp = logp.detach().clone().requires_grad_(True)
    ppo, _ = ppo_clip_loss(ppo_logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    ppo.sum().backward()
    assert ppo_logp.grad[0, 0] == 0 and (logp.grad[0, :4] != 0).all()


def test_cispo_default_has_no_weight_floor():
    logp = torch.tensor([[-3.0]])
    loss, stats = cispo_loss(logp, torch.tensor([[0.0]]), torch.tensor([-1.0]), torch.ones(1, 1))
    # r = e^-3 is kept as the weight (no floor); loss = -w * A * logp = e^-3 * -3.
    assert loss.item() == pytest.approx(math.exp(-3) * -3.0, rel=1e-6)
    assert stats["cispo_clip_frac_low"].item() == 0.0


def test_reinforce_pp_returns_by_hand():
    # Row 0: two sampled tokens, an observation (masked) of two, one sampled token.
    # Row 1: two sampled tokens then padding. Row 2: nothing to train.
    kl = torch.tensor([[0.1, 0.2, 5.0, 5.0, 0.3], [0.0, 0.2, 9.0, 9.0, 9.0], [1.0] * 5])
    mask = torch.tensor([[1, 1, 0, 0, 1], [1, 1, 0, 0, 0], [0] * 5])
    outcome = torch.tensor([1.0, -1.0, 3.0])
    returns = reinforce_pp_token_returns(outcome, kl, mask, kl_coef=0.5)
    # Rewards: row 0: -0.05, -0.1, (obs), (obs), -0.15 + 1; row 1: 0, -0.1 - 1.
    expected = [[0.7, 0.75, 0.0, 0.0, 0.85], [-1.1, -1.1, 0.0, 0.0, 0.0], [0.0] * 5]
    torch.testing.assert_close(returns, torch.tensor(expected))
    # Normalised over every policy token of the batch, with one mean and one std.
    values = [0.7, 0.75, 0.85, -1.1, -1.1]
    mean, std = statistics.mean(values), statistics.stdev(values)
    adv = normalise_over_batch(returns, mask)
    want = [[(v - mean) / (std + 1e-6) for v in values[:2]] + [0, 0, (0.85 - mean) / (std + 1e-6)]]
    want += [[(-1.1 - mean) / (std + 1e-6)] * 2 + [0, 0, 0], [0.0] * 5]
    torch.testing.assert_close(adv, torch.tensor(want), rtol=1e-5, atol=1e-6)


def test_batch_normalisation_is_global_and_adds_up_over_parts():
    """Two parts of a batch (two trainer ranks): summing their moments normalises each
    part as the whole batch would be, not per part."""
    a = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    ma = torch.tensor([[1, 1, 0], [1, 0, 0]])
    b = torch.tensor([[10.0, 20.0, 30.0]])
    mb = torch.tensor([[1, 1, 1]])
    whole = normalise_over_batch(
        torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [10.0, 20.0, 30.0]]),
        torch.cat([ma, mb]),
    )
    moments = tuple(
        x + y for x, y in zip(masked_moments(a, ma), masked_moments(b, mb), strict=True)
    )
    torch.testing.assert_close(normalise_over_batch(a, ma, moments), whole[:2])
    torch.testing.assert_close(normalise_over_batch(b, mb, moments), whole[2:])
    assert not torch.allclose(normalise_over_batch(a, ma), whole[:2])  # per part differs


def test_reinforce_pp_leaves_the_outcome_rewards_to_the_trainer():
    rewards = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    torch.testing.assert_close(compute_advantages("reinforce_pp", rewards), rewards)
