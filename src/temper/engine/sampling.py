"""Token sampling for the native engine: greedy, temperature, top-k, top-p.

Randomness is counter-based: sample stream ``key`` draws its t-th token with
the uniform number ``splitmix64(key + (t + 1) * GAMMA)``, i.e. the t-th output of
a SplitMix64 generator seeded with ``key``. The key of a seeded request is
derived from ``(seed, sample_index)``, so a sample's tokens depend only on its
seed, its index and the model's logits, never on which other sequences share
the batch. Unseeded requests get a key drawn from one shared
`torch.Generator`. Each row then draws its token by inverse-CDF sampling: the
first token whose cumulative (filtered, tempered) probability exceeds ``u``.

The returned logprob is always the raw model logprob, ``log_softmax(logits)``
at the chosen token, before temperature, filters, penalties and logits
processors. Those (`SamplingParams.shapes_logits`) act on a copy of the logits
that only the draw sees (`shaped_logits`); rows without them cost nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from temper.engine.base import LogitsProcessor, SamplingParams

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _mix64(z: int) -> int:
    z &= _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


def stream_key(seed: int, index: int) -> int:
    """The 64-bit random-stream key of sample ``index`` of a request seeded with ``seed``."""
    return _mix64(_mix64(seed & _MASK64) ^ _mix64((index + 1) * _GAMMA))


def uniforms(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """``u[i]`` in [0, 1): output number ``counters[i]`` of the SplitMix64 stream ``keys[i]``.

    Both arrays are ``uint64``; the result is ``float64`` with 53 random bits.
    """
    with np.errstate(over="ignore"):
        z = keys + (counters + np.uint64(1)) * np.uint64(_GAMMA)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclass
class RowParams:
    """Per-row sampling parameters of one batch, as tensors (rows may mix settings)."""

    temperature: torch.Tensor  # [B] float32; 0 means greedy
    top_k: torch.Tensor  # [B] int64; 0 means off
    top_p: torch.Tensor  # [B] float32; 1 means off
    all_greedy: bool
    any_greedy: bool
    any_top_k: bool
    any_top_p: bool
    unit_temperature: bool  # every row samples at temperature 1

    @classmethod
    def build(cls, temperature: list[float], top_k: list[int], top_p: list[float]) -> RowParams:
        return cls(
            temperature=torch.tensor(temperature, dtype=torch.float32),
            top_k=torch.tensor(top_k, dtype=torch.int64),
            top_p=torch.tensor(top_p, dtype=torch.float32),
            all_greedy=all(t == 0.0 for t in temperature),
            any_greedy=any(t == 0.0 for t in temperature),
            any_top_k=any(k > 0 for k in top_k),
            any_top_p=any(p < 1.0 for p in top_p),
            unit_temperature=all(t == 1.0 for t in temperature),
        )


def _filtered_sample(scaled: torch.Tensor, params: RowParams, u: torch.Tensor) -> torch.Tensor:
    """Sample after top-k / top-p filtering (works in descending-sorted order)."""
    vocab = scaled.shape[-1]
    vals, order = scaled.sort(dim=-1, descending=True)
    if params.any_top_k:
        rank = torch.arange(vocab, device=scaled.device)
        k = torch.where(params.top_k > 0, params.top_k, vocab).unsqueeze(1)
        vals = vals.masked_fill(rank >= k, float("-inf"))
    probs = torch.softmax(vals, dim=-1)
    cdf = probs.cumsum(dim=-1)
    if params.any_top_p:
        # Keep a token while the mass strictly before it is below top_p (the top
        # token always survives), then renormalise.
        drop = (cdf - probs) >= params.top_p.unsqueeze(1)
        probs = probs.masked_fill(drop, 0.0)
        cdf = probs.cumsum(dim=-1)
    pick = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    # u * total can round up to total (p ~ 1e-8): fall back to the top token.
    pick = pick.masked_fill_(pick >= vocab, 0)
    return order.gather(1, pick.unsqueeze(1)).squeeze(1)


class PenaltyProcessor:
    """OpenAI presence/frequency penalties over the tokens this sample generated.

    ``logits[t] -= presence + frequency * count(t)`` for every token t generated
    so far (count > 0); the prompt does not count.
    """

    def __init__(self, presence: float, frequency: float) -> None:
        self.presence = presence
        self.frequency = frequency
        self.counts: dict[int, int] = {}

    def apply(self, logits: torch.Tensor) -> None:
        if not self.counts:
            return
        ids = torch.tensor(list(self.counts), dtype=torch.int64)
        counts = torch.tensor(list(self.counts.values()), dtype=logits.dtype)
        logits.index_add_(0, ids, -(self.presence + self.frequency * counts))

    def accept(self, token_id: int) -> None:
        self.counts[token_id] = self.counts.get(token_id, 0) + 1


def row_processors(params: SamplingParams) -> list[LogitsProcessor]:
    """Fresh per-sample processors for ``params``: penalties first, then its own."""
    out: list[LogitsProcessor] = []
    if params.presence_penalty or params.frequency_penalty:
        out.append(PenaltyProcessor(params.presence_penalty, params.frequency_penalty))
    out.extend(factory() for factory in params.logits_processors)
    return out


def shaped_logits(
    logits: torch.Tensor, processors: Sequence[Sequence[LogitsProcessor]]
) -> torch.Tensor | None:
    """A copy of ``logits [B, V]`` with each row's processors applied, or None
    when no row has any (then sampling uses the raw logits, at no cost)."""
    if not any(processors):
        return None
    shaped = logits.clone()
    for row, procs in enumerate(processors):
        for proc in procs:
            proc.apply(shaped[row])
    return shaped


def accept_tokens(processors: Sequence[Sequence[LogitsProcessor]], tokens: torch.Tensor) -> None:
    """Tell each row's processors which token the row drew."""
    if not any(processors):
        return
    ids = tokens.tolist()
    for row, procs in enumerate(processors):
        for proc in procs:
            proc.accept(ids[row])


def top_alternatives(logprobs: torch.Tensor, wanted: Sequence[int]) -> list[dict[int, float]]:
    """Per row, the ``wanted[row]`` most likely token ids with their logprobs."""
    k = max(wanted)
    vals, ids = logprobs.topk(k, dim=-1)
    vals_l, ids_l = vals.tolist(), ids.tolist()
    return [dict(zip(ids_l[r][:n], vals_l[r][:n], strict=True)) for r, n in enumerate(wanted)]


def token_scores(
    logits: torch.Tensor, token_ids: torch.Tensor, top_logprobs: int = 0
) -> tuple[list[float], list[dict[int, float]] | None]:
    """From float32 ``logits [L, V]`` of ids ``token_ids [L]``: each next id's raw
    logprob (L - 1 values) and, with ``top_logprobs``, the top ids at each position."""
    logprobs = torch.log_softmax(logits[:-1].float(), dim=-1)
    chosen = logprobs.gather(1, token_ids[1:].view(-1, 1))[:, 0].tolist()
    if not top_logprobs:
        return chosen, None
    if not chosen:
        return chosen, []
    return chosen, top_alternatives(logprobs, [top_logprobs] * logprobs.shape[0])


def sample(
    logits: torch.Tensor,
    params: RowParams,
    u: torch.Tensor | None,
    shaped: torch.Tensor | None = None,
    logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of float32 ``logits [B, V]``.

    ``u [B]`` holds one uniform number per row (unused for greedy rows; may be
    None when every row is greedy). ``shaped``, when given, is what the draw
    uses instead of ``logits`` (penalties, grammar masks); the returned logprob
    is that of the raw ``logits`` either way (``logprobs``: their
    ``log_softmax`` if the caller has it already). Returns ``(token_ids [B]
    int64, raw_logprobs [B] float32)``.
    """
    raw = torch.log_softmax(logits, dim=-1) if logprobs is None else logprobs
    # The raw probabilities serve the draw too, unless penalties or a grammar shaped it.
    reuse_raw = shaped is None and params.unit_temperature
    if shaped is not None:
        logits = shaped
    if params.all_greedy:
        tokens = logits.argmax(dim=-1)
    else:
        assert u is not None
        if params.unit_temperature:
            scaled = logits
        else:
            scaled = logits / params.temperature.clamp(min=1e-6).unsqueeze(1)
        u32 = u.to(torch.float32)
        if params.any_top_k or params.any_top_p:
            tokens = _filtered_sample(scaled, params, u32)
        else:
            probs = raw.exp() if reuse_raw else torch.softmax(scaled, dim=-1)
            cdf = probs.cumsum(dim=-1)
            tokens = torch.searchsorted(cdf, (u32 * cdf[:, -1]).unsqueeze(1), right=True)
            tokens = tokens.squeeze(1)
            over = tokens >= logits.shape[-1]  # rounding put u * total at total
            if bool(over.any()):
                tokens = torch.where(over, logits.argmax(dim=-1), tokens)
        if params.any_greedy:
            tokens = torch.where(params.temperature == 0, logits.argmax(dim=-1), tokens)
    chosen = raw.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return tokens, chosen
