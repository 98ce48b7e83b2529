"""token_logprobs and entropy_from_logits against hand-computed values."""

import math

import pytest
import torch

from temper.algos import entropy_from_logits, token_logprobs

# softmax([0, ln 2, ln 3]) = [1, 2, 3] / 6
LOGITS = torch.tensor([[0.0, math.log(2.0), math.log(3.0)]])


def test_token_logprobs_hand_values():
    out = token_logprobs(LOGITS, torch.tensor([2]))
    torch.testing.assert_close(out, torch.tensor([math.log(0.5)]))
    # T = 0.5 doubles the logits: softmax = [1, 4, 9] / 14
    out = token_logprobs(LOGITS, torch.tensor([1]), temperature=0.5)
    torch.testing.assert_close(out, torch.tensor([math.log(4 / 14)]))


def test_token_logprobs_batched_shape_and_dtype():
    logits = LOGITS.expand(2, 3, 3).to(torch.bfloat16)
    ids = torch.tensor([[0, 1, 2], [2, 1, 0]])
    out = token_logprobs(logits, ids, chunk_rows=2)
    assert out.shape == (2, 3) and out.dtype == torch.float32
    logp = [math.log(1 / 6), math.log(2 / 6), math.log(3 / 6)]
    expected = torch.tensor([[logp[0], logp[1], logp[2]], [logp[2], logp[1], logp[0]]])
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_gradient_matches_log_softmax(temperature):
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 7, (2, 5))
    weights = torch.randn(2, 5, dtype=torch.float64)

    ours = token_logprobs(logits, ids, temperature=temperature, chunk_rows=3)
    (ours * weights).sum().backward()
    grad_ours = logits.grad.clone()
    logits.grad = None

    ref = torch.log_softmax(logits / temperature, -1).gather(-1, ids[..., None]).squeeze(-1)
    (ref * weights).sum().backward()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(grad_ours, logits.grad)


def test_token_logprobs_gradcheck():
    logits = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([0, 4, 2, 2])
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, ids, 0.9, chunk_rows=3), (logits,))


def test_token_logprobs_shape_mismatch():
    with pytest.raises(ValueError, match="share all but the last"):
        token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_entropy_hand_values():
    # p = [1/6, 1/3, 1/2]: H = ln6/6 + ln3/3 + ln2/2
    h = math.log(6) / 6 + math.log(3) / 3 + math.log(2) / 2
    logits = torch.cat([LOGITS, torch.zeros(1, 3)])  # second row uniform: H = ln 3
    out = entropy_from_logits(logits, chunk_rows=1)
    torch.testing.assert_close(out, torch.tensor([h, math.log(3)]))
    # T = 0.5: p = [1, 4, 9] / 14
    p = [1 / 14, 4 / 14, 9 / 14]
    h_half = -sum(x * math.log(x) for x in p)
    torch.testing.assert_close(entropy_from_logits(LOGITS, temperature=0.5), torch.tensor([h_half]))
