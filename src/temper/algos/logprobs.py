"""Per-token log-probabilities and entropies from logits, computed in chunks.

A full `log_softmax` over `[batch, seq, vocab]` logits allocates another tensor of
that size (and a float32 copy when the logits are bf16), and autograd keeps it for
the backward pass. `token_logprobs` instead walks over the rows in chunks: it keeps
only one `[chunk, vocab]` float32 buffer at a time and saves just the logits and one
log-sum-exp per token for backward, where the gradient is rebuilt chunk by chunk.
"""

from __future__ import annotations

import torch

#: Elements per chunk (rows x vocab) processed at once: 2^24 float32 values = 64 MiB.
DEFAULT_CHUNK_ELEMENTS = 1 << 24


def _chunk_rows(vocab: int, chunk_rows: int | None) -> int:
    if chunk_rows is not None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        return chunk_rows
    return max(1, DEFAULT_CHUNK_ELEMENTS // max(vocab, 1))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision logits, float64 stays float64."""
    return torch.promote_types(dtype, torch.float32)


def _scaled(chunk: torch.Tensor, dtype: torch.dtype, temperature: float) -> torch.Tensor:
    """`chunk / temperature` in `dtype`, without a copy when nothing changes."""
    z = chunk.to(dtype)
    return z if temperature == 1.0 else z / temperature


class _TokenLogprob(torch.autograd.Function):
    """log softmax(z / T)[y] for each row of `z`, with a chunked forward and backward.

    Gradient: d/dz_k = (1[k = y] - softmax(z / T)_k) / T, times the incoming grad.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        logits: torch.Tensor,
        token_ids: torch.Tensor,
        temperature: float,
        chunk_rows: int,
    ) -> torch.Tensor:
        dtype = _compute_dtype(logits.dtype)
        n = logits.shape[0]
        out = torch.empty(n, dtype=dtype, device=logits.device)
        lse = torch.empty(n, dtype=dtype, device=logits.device)
        for start in range(0, n, chunk_rows):
            end = min(start + chunk_rows, n)
            z = _scaled(logits[start:end], dtype, temperature)
            lse[start:end] = torch.logsumexp(z, dim=-1)
            picked = z.gather(1, token_ids[start:end, None]).squeeze(1)
            out[start:end] = picked - lse[start:end]
        ctx.save_for_backward(logits, token_ids, lse)
        ctx.temperature = temperature
        ctx.chunk_rows = chunk_rows
        return out

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, None, None, None]:
        logits, token_ids, lse = ctx.saved_tensors
        temperature: float = ctx.temperature
        chunk_rows: int = ctx.chunk_rows
        grad = torch.empty_like(logits)
        n = logits.shape[0]
        for start in range(0, n, chunk_rows):
            end = min(start + chunk_rows, n)
            z = _scaled(logits[start:end], lse.dtype, temperature)
            g_out = grad_out[start:end, None].to(lse.dtype)
            g = torch.exp(z - lse[start:end, None]).mul_(-g_out)
            g.scatter_add_(1, token_ids[start:end, None], g_out)
            grad[start:end] = g.div_(temperature).to(logits.dtype)
        return grad, None, None, None


def token_logprobs(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """Log-probability of each chosen token: log softmax(logits / T)[token_id].

        logp_t = z_t[y_t] / T - log sum_v exp(z_t[v] / T)

    `logits` is `[..., vocab]` and `token_ids` is `[...]` (same leading shape, e.g.
    `[batch, seq]`); the result has the shape of `token_ids` and is float32 (float64
    for float64 logits). The caller aligns logits and targets (logits at position t
    predict token t + 1). `temperature` must match the one used for sampling so that
    these logprobs are comparable with the engine's. Differentiable; at most
    `chunk_rows` rows of `[rows, vocab]` are expanded at a time (default: about 64 MiB
    worth).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits.shape[:-1] != token_ids.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and token_ids {tuple(token_ids.shape)} "
            "must share all but the last dimension"
        )
    vocab = logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab)
    flat_ids = token_ids.reshape(-1).long()
    rows = _chunk_rows(vocab, chunk_rows)
    out = _TokenLogprob.apply(flat_logits, flat_ids, float(temperature), rows)
    return out.reshape(token_ids.shape)


def entropy_from_logits(
    logits: torch.Tensor, temperature: float = 1.0, chunk_rows: int | None = None
) -> torch.Tensor:
    """Entropy of the next-token distribution at each position.

        H_t = -sum_v p_t(v) log p_t(v) = logsumexp(z_t) - sum_v p_t(v) z_t(v),  z = logits / T

    `logits` is `[..., vocab]`; the result is `[...]` in float32 (float64 for
    float64 logits). The forward pass runs in chunks of `chunk_rows` rows, so when
    gradients are not needed (the usual case: entropy as a metric, under
    `torch.no_grad()`) the extra memory is one chunk. With gradients, autograd
    keeps each chunk's softmax for backward.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    rows = _chunk_rows(vocab, chunk_rows)
    dtype = _compute_dtype(logits.dtype)
    parts = []
    for start in range(0, flat.shape[0], rows):
        z = _scaled(flat[start : start + rows], dtype, temperature)
        lse = torch.logsumexp(z, dim=-1)
        probs = torch.softmax(z, dim=-1)
        parts.append(lse - (probs * z).sum(dim=-1))
    if not parts:
        return torch.empty(logits.shape[:-1], dtype=dtype, device=logits.device)
    return torch.cat(parts).reshape(logits.shape[:-1])
