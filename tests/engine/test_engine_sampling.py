"""The native engine's sampler: distributions, filters, counter-based streams."""

from __future__ import annotations

import numpy as np
import torch

from temper.engine.sampling import RowParams, sample, stream_key, uniforms

ROWS = 40_000


def draw(
    logits: list[float], temperature=1.0, top_k=0, top_p=1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor([logits] * ROWS, dtype=torch.float32)
    params = RowParams.build([temperature] * ROWS, [top_k] * ROWS, [top_p] * ROWS)
    keys = np.array([stream_key(7, i) for i in range(ROWS)], dtype=np.uint64)
    u = torch.from_numpy(uniforms(keys, np.zeros(ROWS, dtype=np.uint64)))
    return sample(x, params, u)


def freqs(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab).float() / tokens.numel()


LOGITS = [2.0, 1.0, 0.5, -1.0, 0.0]


def test_uniforms_are_uniform_and_depend_on_key_and_counter() -> None:
    keys = np.array([stream_key(1, i) for i in range(1000)], dtype=np.uint64)
    u = np.concatenate([uniforms(keys, np.full(1000, t, dtype=np.uint64)) for t in range(50)])
    assert u.min() >= 0.0 and u.max() < 1.0
    hist, _ = np.histogram(u, bins=10, range=(0, 1))
    assert np.all(np.abs(hist / u.size - 0.1) < 0.01)
    assert len(np.unique(u)) == u.size
    assert stream_key(1, 0) != stream_key(1, 1) != stream_key(2, 0)


def test_sampling_follows_softmax_and_returns_raw_logprobs() -> None:
    tokens, lps = draw(LOGITS)
    expected = torch.softmax(torch.tensor(LOGITS), -1)
    assert torch.allclose(freqs(tokens, 5), expected, atol=0.01)
    raw = torch.log_softmax(torch.tensor(LOGITS), -1)
    assert torch.allclose(lps, raw[tokens])


def test_temperature_scales_the_distribution_but_not_the_logprobs() -> None:
    tokens, lps = draw(LOGITS, temperature=0.5)
    expected = torch.softmax(torch.tensor(LOGITS) / 0.5, -1)
    assert torch.allclose(freqs(tokens, 5), expected, atol=0.01)
    assert torch.allclose(lps, torch.log_softmax(torch.tensor(LOGITS), -1)[tokens])


def test_top_k_and_top_p_filter_then_renormalise() -> None:
    tokens, _ = draw(LOGITS, top_k=2)
    p = torch.softmax(torch.tensor(LOGITS[:2]), -1)
    assert torch.allclose(freqs(tokens, 5), torch.cat([p, torch.zeros(3)]), atol=0.01)
    probs = torch.softmax(torch.tensor(LOGITS), -1)  # ~[.53, .20, .12, .03, .07]
    tokens, _ = draw(LOGITS, top_p=0.7)  # keeps tokens 0 and 1 (mass before 2 is .73)
    assert set(tokens.unique().tolist()) == {0, 1}
    kept = probs[:2] / probs[:2].sum()
    assert torch.allclose(freqs(tokens, 5)[:2], kept, atol=0.01)


def test_greedy_rows_mix_with_sampled_rows() -> None:
    x = torch.tensor([LOGITS, LOGITS[::-1]] * 4)
    params = RowParams.build([0.0, 1.0] * 4, [0] * 8, [1.0] * 8)
    u = torch.linspace(0.05, 0.95, 8, dtype=torch.float64)
    tokens, _ = sample(x, params, u)
    assert tokens[0::2].tolist() == [0] * 4
    all_greedy = RowParams.build([0.0] * 8, [0] * 8, [1.0] * 8)
    assert sample(x, all_greedy, None)[0].tolist() == [0, 4] * 4
