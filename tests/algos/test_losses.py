"""ppo_clip_loss and aggregate_loss against hand-computed values."""

import math

import pytest
import torch

from temper.algos import aggregate_loss, ppo_clip_loss

# ratios 0.5, 1.0, 1.5, 4.0 in both rows; row 0 has A = +1, row 1 has A = -1
RATIOS = torch.tensor([[0.5, 1.0, 1.5, 4.0], [0.5, 1.0, 1.5, 4.0]])
OLD = torch.zeros(2, 4)
ADV = torch.tensor([1.0, -1.0])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])


def _logprobs() -> torch.Tensor:
    return RATIOS.log().clone().requires_grad_(True)


def test_clip_higher_hand_values_and_grads():
    logp = _logprobs()
    loss, stats = ppo_clip_loss(logp, OLD, ADV, MASK, clip_low=0.2, clip_high=0.28)
    # A=+1: max(-r, -clip(r, 0.8, 1.28)) -> -0.5, -1, -1.28 (clipped), masked 0
    # A=-1: max(r, clip(r, 0.8, 1.28))   ->  0.8 (clipped), 1, 1.5, 4
    expected = torch.tensor([[-0.5, -1.0, -1.28, 0.0], [0.8, 1.0, 1.5, 4.0]])
    torch.testing.assert_close(loss, expected)
    # d loss / d logp = -A * r where unclipped, 0 where a bound is active or masked
    loss.sum().backward()
    torch.testing.assert_close(
        logp.grad, torch.tensor([[-0.5, -1.0, 0.0, 0.0], [0.0, 1.0, 1.5, 4.0]])
    )
    # 7 masked tokens; high clip: row 0 r=1.5; low clip: row 1 r=0.5
    torch.testing.assert_close(stats["clip_frac_high"], torch.tensor(1 / 7))
    torch.testing.assert_close(stats["clip_frac_low"], torch.tensor(1 / 7))
    torch.testing.assert_close(stats["dual_clip_frac"], torch.tensor(0.0))
    torch.testing.assert_close(stats["ratio_mean"], torch.tensor(10 / 7))
    torch.testing.assert_close(stats["ratio_max"], torch.tensor(4.0))
    torch.testing.assert_close(stats["ratio_min"], torch.tensor(0.5))
    assert all(not v.requires_grad and v.dim() == 0 for v in stats.values())


def test_dual_clip_bounds_negative_advantage():
    logp = _logprobs()
    loss, stats = ppo_clip_loss(logp, OLD, ADV, MASK, clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    # row 1, r = 4: min(max(4, 1.28), 3 * 1) = 3; nothing else changes
    expected = torch.tensor([[-0.5, -1.0, -1.28, 0.0], [0.8, 1.0, 1.5, 3.0]])
    torch.testing.assert_close(loss, expected)
    loss.sum().backward()
    assert logp.grad[1, 3] == 0.0
    torch.testing.assert_close(stats["dual_clip_frac"], torch.tensor(1 / 7))


def test_symmetric_clip_and_per_token_advantages():
    per_token = ADV[:, None].expand(2, 4)
    loss_seq, _ = ppo_clip_loss(RATIOS.log(), OLD, ADV, MASK)
    loss_tok, _ = ppo_clip_loss(RATIOS.log(), OLD, per_token, MASK)
    torch.testing.assert_close(loss_seq, loss_tok)
    # eps = 0.2: A=+1, r=1.5 -> -1.2
    assert loss_seq[0, 2].item() == pytest.approx(-1.2)


def test_garbage_on_padding_gives_finite_grads():
    logp = torch.tensor([[0.0, 1000.0]], requires_grad=True)
    loss, _ = ppo_clip_loss(logp, torch.zeros(1, 2), torch.tensor([-1.0]), torch.tensor([[1, 0]]))
    loss.sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert loss[0, 1] == 0.0


def test_bad_dual_clip():
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_loss(OLD, OLD, ADV, MASK, dual_clip=0.5)


LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
AGG_MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])


def test_aggregation_modes_hand_values():
    # masked sums: row 0 = 6 (3 tokens), row 1 = 11 (2 tokens), row 2 empty (not counted)
    assert aggregate_loss(LOSS, AGG_MASK, "token-mean").item() == pytest.approx(17 / 5)
    assert aggregate_loss(LOSS, AGG_MASK, "seq-mean-token-sum").item() == pytest.approx(17 / 2)
    assert aggregate_loss(LOSS, AGG_MASK, "seq-mean-token-mean").item() == pytest.approx(
        (6 / 3 + 11 / 2) / 2
    )
    # explicit normalisers replace the local counts
    assert aggregate_loss(LOSS, AGG_MASK, "token-mean", total_tokens=10).item() == pytest.approx(
        1.7
    )
    assert aggregate_loss(
        LOSS, AGG_MASK, "seq-mean-token-sum", total_seqs=4
    ).item() == pytest.approx(17 / 4)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate_loss(LOSS, AGG_MASK, "sum")  # type: ignore[arg-type]


def test_empty_mask_gives_zero():
    assert aggregate_loss(LOSS, torch.zeros_like(AGG_MASK), "token-mean").item() == 0.0
    assert aggregate_loss(LOSS, torch.zeros_like(AGG_MASK), "seq-mean-token-mean").item() == 0.0


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_gradient_accumulation_equals_one_big_batch(mode):
    torch.manual_seed(0)
    weight = torch.randn(6, requires_grad=True)
    features = torch.randn(5, 7, 6)
    mask = torch.ones(5, 7)
    for row, length in enumerate([7, 3, 5, 0, 1]):  # row 3 has no policy tokens
        mask[row, length:] = 0

    def per_token(rows: slice) -> torch.Tensor:
        return torch.tanh(features[rows] @ weight)

    big = aggregate_loss(per_token(slice(0, 5)), mask, mode)
    (big_grad,) = torch.autograd.grad(big, weight)

    total_tokens = mask.sum()
    total_seqs = (mask.sum(-1) > 0).sum()
    accumulated = torch.zeros(())
    grad = torch.zeros(6)
    for rows in (slice(0, 2), slice(2, 4), slice(4, 5)):
        micro = aggregate_loss(
            per_token(rows), mask[rows], mode, total_tokens=total_tokens, total_seqs=total_seqs
        )
        accumulated = accumulated + micro.detach()
        grad += torch.autograd.grad(micro, weight)[0]
    torch.testing.assert_close(accumulated, big.detach())
    torch.testing.assert_close(grad, big_grad)
    # and with local counts the micro-batch means do NOT add up to the big batch
    local = sum(
        aggregate_loss(per_token(r), mask[r], mode).item() for r in (slice(0, 2), slice(2, 5))
    )
    assert not math.isclose(local, big.item())
