"""A native forward pass for Llama-family decoder LMs over a `SlotKVCache`.

`LlamaFamilyModel` copies the weights of a Hugging Face ``LlamaForCausalLM``,
``MistralForCausalLM``, ``Qwen2ForCausalLM`` or ``Qwen3ForCausalLM`` into its own
tensors (`temper.engine.llama_weights`) and runs prefill and decode against
the slot cache; on CPU in float32, decode attention runs in a fused C kernel
(`temper.engine.cpu_kernels`). It reproduces the HF math (RMSNorm,
rotary embeddings including the "linear", "llama3" and "yarn" variants, grouped
query attention, Qwen2 q/k/v biases, Qwen3 q/k norms, tied embeddings) so its
logits match the HF forward to float rounding.

It does not implement sliding-window attention: when the config enables it, the
usable context is capped at the window (where full and sliding attention agree).
Dynamic and "longrope" RoPE are likewise capped at the original pretraining
length. Anything else (other architectures, activations, RoPE types) raises
`UnsupportedModelError`, which suggests ``engine.type = "hf"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from temper.engine.cpu_kernels import decode_attention
from temper.engine.kv_cache import SlotKVCache
from temper.engine.llama_weights import LlamaWeights, rope_table
from temper.errors import TemperError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")
_CAPPED_ROPE = ("dynamic", "longrope")


#: Input embeddings to write over token embeddings: (prompt row, position, rows [n, hidden]).
Splice = tuple[int, int, torch.Tensor]


class UnsupportedModelError(TemperError):
    """A model the native engine cannot run."""


def _rope_type(config: Any) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not params:
        return "default"
    if "rope_type" not in params and "type" not in params:
        # Per-layer-type rope parameters (e.g. {"full_attention": {...}}) are not supported.
        raise UnsupportedModelError(
            'native engine does not support per-layer RoPE parameters; use engine.type = "hf"'
        )
    return str(params.get("rope_type", params.get("type", "default")))


def supported_context(config: Any, requested: int | None) -> int:
    """The longest context the native forward reproduces exactly for ``config``."""
    limit = int(config.max_position_embeddings)
    if _rope_type(config) in _CAPPED_ROPE:
        params = getattr(config, "rope_parameters", None) or {}
        limit = int(params.get("original_max_position_embeddings") or limit)
    layer_types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    sliding = "sliding_attention" in layer_types or (
        config.model_type == "mistral" and window is not None
    )
    if sliding and window:
        limit = min(limit, int(window))
    return limit if requested is None else min(limit, int(requested))


def check_supported(model: torch.nn.Module) -> None:
    """Raise `UnsupportedModelError` unless the native forward can run ``model``."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    hint = 'use engine.type = "hf" for this model'
    if model_type not in SUPPORTED_MODEL_TYPES:
        name = type(model).__name__
        raise UnsupportedModelError(
            f"native engine supports {', '.join(SUPPORTED_MODEL_TYPES)} models, "
            f"not {name} (model_type={model_type!r}); {hint}"
        )
    if not hasattr(getattr(model, "model", None), "rotary_emb"):
        raise UnsupportedModelError(
            f"native engine needs a *ForCausalLM model, got {type(model).__name__}; {hint}"
        )
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedModelError(
            f"native engine supports hidden_act='silu', not {config.hidden_act!r}; {hint}"
        )
    rope = _rope_type(config)
    if rope not in _STATIC_ROPE + _CAPPED_ROPE:
        raise UnsupportedModelError(f"native engine does not support rope_type={rope!r}; {hint}")


def _linear(
    x: torch.Tensor,
    wt: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``residual + x @ wt + bias`` for a transposed weight ``wt [in, out]``: one GEMM
    (the residual is accumulated by the GEMM itself)."""
    shape = (*x.shape[:-1], wt.shape[1])
    x2 = x.reshape(-1, x.shape[-1])
    if residual is not None:
        y = torch.addmm(residual.reshape(-1, wt.shape[1]), x2, wt)
        if bias is not None:
            y.add_(bias)
    elif bias is not None:
        y = torch.addmm(bias, x2, wt)
    else:
        y = torch.mm(x2, wt)
    return y.view(shape)


class LlamaFamilyModel:
    """Forward of a Llama-family model against a `SlotKVCache`, over `LlamaWeights`.

    The weights are copies (optionally cast to ``dtype``); later changes to the
    HF model do not reach this object except through `load_state_dict`.
    ``cpu_kernels`` allows the fused decode-attention kernel (float32 on CPU).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        dtype: torch.dtype | None = None,
        max_context: int | None = None,
        cpu_kernels: bool = True,
    ) -> None:
        check_supported(model)
        cfg = model.config
        self.config = cfg
        self.dtype = dtype or next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.num_layers = int(cfg.num_hidden_layers)
        self.num_heads = int(cfg.num_attention_heads)
        self.num_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads)
        self.hidden_size = int(cfg.hidden_size)
        self.vocab_size = int(cfg.vocab_size)
        self.eps = float(cfg.rms_norm_eps)
        self.scale = self.head_dim**-0.5
        self._eps = torch.tensor(self.eps, dtype=torch.float32, device=self.device)
        self.max_context = supported_context(cfg, max_context)
        self.qk_norm = cfg.model_type == "qwen3"
        # Fused decode attention (`temper.engine.cpu_kernels`): float32 on CPU only.
        use_kernel = cpu_kernels and self.dtype == torch.float32 and self.device.type == "cpu"
        self._attention_kernel = decode_attention() if use_kernel else None

        heads = (self.num_heads, self.num_kv_heads, self.head_dim)
        self.weights = LlamaWeights(model, self.dtype, self.device, heads, self.qk_norm)
        w = self.weights
        self.embed, self.lm_head, self.final_norm = w.embed, w.lm_head, w.final_norm
        self.layers, self.intermediate = w.layers, w.intermediate
        self.rope = rope_table(model, self.max_context, self.head_dim, self.dtype, self.device)

    def parameter_names(self) -> list[str]:
        return self.weights.parameter_names()

    def read(self, name: str) -> torch.Tensor:
        """A copy of weight ``name`` in HF's layout (`LlamaWeights.read`)."""
        return self.weights.read(name)

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        """Copy tensors (HF names) into the engine's weights in place (`LlamaWeights.load_state_dict`)."""
        return self.weights.load_state_dict(state_dict)

    def new_cache(self, max_slots: int) -> SlotKVCache:
        return SlotKVCache(
            self.num_layers,
            self.num_kv_heads,
            self.head_dim,
            max_slots=max_slots,
            max_context=self.max_context,
            dtype=self.dtype,
            device=self.device,
        )

    # ------------------------------------------------------------------ forward
    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """RMSNorm as HF computes it: normalise in float32, cast back, scale by ``w``.

        The mean square comes from one norm kernel (``|x|^2 / n``) rather than
        HF's square-then-mean, which costs two fewer kernels per call and
        differs from HF by float rounding only.
        """
        xf = x if x.dtype == torch.float32 else x.float()
        norm = torch.linalg.vector_norm(xf, dim=-1, keepdim=True)
        inv = torch.addcmul(self._eps, norm, norm, value=1.0 / x.shape[-1]).rsqrt_()
        y = xf * inv
        return y.mul_(w) if x.dtype == torch.float32 else w * y.to(x.dtype)

    def _qkv(self, layer: dict[str, Any], x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        """Project ``x [N, S, hidden]`` to ``[N, S, heads + 2 * kv_heads, D]``: the query
        heads, the key heads and the value heads, with RoPE applied to q and k in place.

        ``rope`` holds ``cos + i sin`` per position, broadcastable to ``[N, S, 1, D/2]``.
        """
        h, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = _linear(self._rms(x, layer["ln1"]), layer["qkv"], layer["qkv_b"])
        qkv = qkv.view(*x.shape[:-1], h + 2 * hk, d)
        qk = qkv[..., : h + hk, :]
        if self.qk_norm:
            qk[..., :h, :] = self._rms(qk[..., :h, :], layer["q_norm"])
            qk[..., h:, :] = self._rms(qk[..., h:, :], layer["k_norm"])
        pairs = qk.unflatten(-1, (d // 2, 2))
        if qk.dtype in (torch.float32, torch.float64):
            torch.view_as_complex(pairs).mul_(rope)
        else:  # no complex half types on CPU: rotate in float32, round once
            rotated = torch.view_as_complex(pairs.float()) * rope
            qk.copy_(torch.view_as_real(rotated).flatten(-2))
        return qkv

    def _mlp_out(self, layer: dict[str, Any], x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = _linear(attn, layer["o"], layer["o_b"], residual=x)
        gu = _linear(self._rms(x, layer["ln2"]), layer["gate_up"], layer["gate_up_b"])
        gate, up = gu.split(self.intermediate, dim=-1)
        act = F.silu(gate, inplace=True).mul_(up)
        return _linear(act, layer["down"], layer["down_b"], residual=x)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return _linear(self._rms(h, self.final_norm), self.lm_head, None).float()

    def splice(self, x: torch.Tensor, embeds: Sequence[Splice]) -> torch.Tensor:
        """``x [P, L, hidden]`` with ``rows`` written at ``x[p, start:]`` for each
        ``(p, start, rows)``: how image features enter a LLaVA-style language model."""
        for p, start, rows in embeds:
            x[p, start : start + rows.shape[0]] = rows.to(x.dtype)
        return x

    def prefill(
        self,
        token_ids: torch.Tensor,
        lengths: torch.Tensor,
        cache: SlotKVCache,
        dst_rows: torch.Tensor,
        src_rows: torch.Tensor | None = None,
        embeds: Sequence[Splice] = (),
    ) -> torch.Tensor:
        """Run right-padded prompts ``[P, L]`` and write their keys/values to the cache.

        Row ``dst_rows[j]`` of the cache receives prompt ``src_rows[j]`` (default
        ``j``). ``embeds`` replace token embeddings (images, see `splice`).
        Returns float32 logits ``[P, vocab]`` at each prompt's last real
        position (``lengths - 1``). Padding sits after each prompt, so causal
        attention keeps it out of the real positions; its cache entries lie
        beyond the row length and stay masked.
        """
        n, length = token_ids.shape
        h, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        x = self.splice(F.embedding(token_ids, self.embed), embeds)
        rope = self.rope[:length].view(1, length, 1, d // 2)
        rows = torch.arange(n, device=x.device)
        for i, layer in enumerate(self.layers):
            qkv = self._qkv(layer, x, rope).transpose(1, 2)  # [P, heads, L, D]
            q, k, v = qkv[:, :h], qkv[:, h : h + hk], qkv[:, h + hk :]
            cache.write_prefill(i, k, v, dst_rows, src_rows)
            if i == self.num_layers - 1:
                # Only the last positions' logits are wanted, and the last layer's
                # keys/values are already cached: its attention and MLP run there only.
                visible = torch.arange(length, device=x.device) < lengths.unsqueeze(1)
                return self._last_layer(
                    layer, x[rows, lengths - 1], q[rows, :, lengths - 1], k, v, visible
                )
            attn = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=self.scale, enable_gqa=h != hk
            )
            x = self._mlp_out(layer, x, attn.transpose(1, 2).reshape(n, length, h * d))
        raise AssertionError("unreachable: the model has no layers")

    def all_logits(self, token_ids: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[L, vocab]`` at every position of one sequence ``[L]``, with
        no cache: scoring given tokens (``echo`` completions, a distillation teacher)."""
        length = token_ids.shape[0]
        h, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        x = F.embedding(token_ids.view(1, length), self.embed)
        rope = self.rope[:length].view(1, length, 1, d // 2)
        for layer in self.layers:
            qkv = self._qkv(layer, x, rope).transpose(1, 2)  # [1, heads, L, D]
            q, k, v = qkv[:, :h], qkv[:, h : h + hk], qkv[:, h + hk :]
            attn = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=self.scale, enable_gqa=h != hk
            )
            x = self._mlp_out(layer, x, attn.transpose(1, 2).reshape(1, length, h * d))
        return self._logits(x[0])

    def _last_layer(
        self,
        layer: dict[str, Any],
        x: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        visible: torch.Tensor,
    ) -> torch.Tensor:
        """Finish the last layer for one query per prompt and return its float32 logits.

        ``x [P, hidden]`` is the layer input and ``q [P, H, D]`` the rotated query at
        that position; ``k``/``v`` are ``[P, Hk, T, D]`` and ``visible [P, T]`` marks
        the keys each query sees.
        """
        n, h, d = q.shape
        attn = F.scaled_dot_product_attention(
            q.unsqueeze(2),
            k,
            v,
            attn_mask=visible.view(n, 1, 1, -1),
            scale=self.scale,
            enable_gqa=h != self.num_kv_heads,
        )
        return self._logits(self._mlp_out(layer, x, attn.reshape(n, h * d)))

    def extend(
        self,
        token_ids: torch.Tensor,
        starts: torch.Tensor,
        lengths: torch.Tensor,
        cache: SlotKVCache,
        rows: list[torch.Tensor],
        embeds: Sequence[Splice] = (),
    ) -> torch.Tensor:
        """Run right-padded prompt *suffixes* ``[P, S]`` on top of keys already in the cache.

        ``embeds`` (positions counted within the suffix) replace token embeddings.
        Suffix p sits at positions ``starts[p] ..``; cache rows ``rows[p]`` (one or
        more: the samples of one prompt) already hold positions ``0..starts[p]-1``
        and receive the suffix's keys/values. Each suffix token attends to its
        row's cached positions and to the suffix up to itself. Returns float32
        logits ``[P, vocab]`` at each suffix's last real position.
        """
        n, width = token_ids.shape
        h, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        steps = torch.arange(width, device=token_ids.device)
        # Padded query positions are clamped; their outputs are never read.
        positions = (starts.unsqueeze(1) + steps).clamp_(max=self.max_context - 1)
        total = int((starts + lengths).max())
        rope = self.rope[positions].unsqueeze(2)  # [P, S, 1, D/2]
        visible = torch.arange(total, device=token_ids.device) <= positions.unsqueeze(2)
        mask = visible.unsqueeze(1)  # [P, 1, S, T]: key t is visible to query j
        first_rows = torch.stack([r[0] for r in rows])
        last = torch.arange(n, device=token_ids.device), lengths - 1
        x = self.splice(F.embedding(token_ids, self.embed), embeds)
        for i, layer in enumerate(self.layers):
            qkv = self._qkv(layer, x, rope)
            q = qkv[:, :, :h]
            k, v = qkv[:, :, h : h + hk].transpose(1, 2), qkv[:, :, h + hk :].transpose(1, 2)
            for p in range(n):
                s0, s1 = int(starts[p]), int(starts[p] + lengths[p])
                cache.k[i, rows[p], :, s0:s1] = k[p, :, : s1 - s0]
                cache.v[i, rows[p], :, s0:s1] = v[p, :, : s1 - s0]
            kk, vv = cache.view_rows(i, first_rows, total)
            if i == self.num_layers - 1:  # see `prefill`
                return self._last_layer(layer, x[last], q[last], kk, vv, visible[last])
            attn = F.scaled_dot_product_attention(
                q.transpose(1, 2), kk, vv, attn_mask=mask, scale=self.scale, enable_gqa=h != hk
            )
            x = self._mlp_out(layer, x, attn.transpose(1, 2).reshape(n, width, h * d))
        raise AssertionError("unreachable: the model has no layers")

    def decode(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: SlotKVCache,
        length: int,
        chunks: Sequence[tuple[int, int, int]] | None = None,
    ) -> torch.Tensor:
        """One decode step for cache rows ``0..B-1``.

        ``token_ids[b]`` sits at ``positions[b]``; row b attends to its cache
        positions ``0..positions[b]`` (``length`` is the largest of these plus one).
        ``chunks`` optionally splits the attention into row ranges ``(r0, r1, t)``
        that each read only their own longest length ``t`` of the cache (cheaper
        when rows are grouped by length). Returns float32 logits ``[B, vocab]``.
        """
        b = token_ids.shape[0]
        h, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        x = F.embedding(token_ids, self.embed)  # [B, hidden]
        rope = self.rope[positions].unsqueeze(1)  # [B, 1, D/2]
        if self._attention_kernel is not None:
            # Each row reads exactly its own positions, so `chunks` is not needed.
            positions = positions.contiguous()
            # One output buffer for all layers: each layer's is consumed before the next.
            attn = torch.empty(b, h * d, dtype=x.dtype, device=x.device)
            for i, layer in enumerate(self.layers):
                qkv = self._qkv(layer, x, rope)  # [B, H + 2 * Hk, D]
                self._attention_kernel(qkv, cache.kv[i], positions, attn, h, hk, d, self.scale)
                x = self._mlp_out(layer, x, attn)
            return self._logits(x)
        index = cache.decode_index(positions)
        pad = torch.arange(length, device=token_ids.device) > positions.unsqueeze(1)
        # Additive mask, built once per step and shared by all layers: one row per
        # (row, kv head), i.e. [B * Hk, 1, length].
        mask = torch.zeros(b, hk, 1, length, dtype=self.dtype, device=x.device)
        mask.masked_fill_(pad.view(b, 1, 1, length), float("-inf"))
        mask = mask.view(b * hk, 1, length)
        if not chunks or len(chunks) == 1:
            chunks = [(0, b, length)]
        group = h // hk
        for i, layer in enumerate(self.layers):
            qkv = self._qkv(layer, x, rope)  # [B, H + 2 * Hk, D]
            cache.write_decode(i, qkv[:, h:], index)
            # The `group` query heads that share a kv head become a length-`group`
            # query sequence; all positions see the same keys, so no causal mask.
            q = qkv[:, :h].reshape(b * hk, group, d)
            outs = [self._decode_attention(q, mask, cache, i, r0, r1, t) for r0, r1, t in chunks]
            attn = outs[0] if len(outs) == 1 else torch.cat(outs)
            x = self._mlp_out(layer, x, attn.reshape(b, h * d))
        return self._logits(x)

    def _decode_attention(
        self,
        q: torch.Tensor,
        mask: torch.Tensor,
        cache: SlotKVCache,
        layer: int,
        r0: int,
        r1: int,
        t: int,
    ) -> torch.Tensor:
        """Attention of rows ``r0..r1-1`` over their first ``t`` cache positions.

        ``q`` is ``[B * Hk, group, D]`` and ``mask`` ``[B * Hk, 1, >= t]``; returns
        ``[(r1 - r0) * Hk, group, D]``. In float32 this is two batched GEMMs and a
        softmax, which for a one-token query costs much less on CPU than the
        fused SDPA kernel; other dtypes use SDPA (it accumulates in float32).
        """
        hk, d = self.num_kv_heads, self.head_dim
        kc, vc = cache.view(layer, r1, t)  # [r1, Hk, t, D], views
        q, mask = q[r0 * hk : r1 * hk], mask[r0 * hk : r1 * hk, :, :t]
        k, v = kc[r0:].reshape(-1, t, d), vc[r0:].reshape(-1, t, d)
        if self.dtype != torch.float32:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        scores = torch.baddbmm(mask, q, k.transpose(1, 2), alpha=self.scale)
        return torch.bmm(torch.softmax(scores, dim=-1), v)

    def chunk_overhead(self) -> int:
        """Cache row-positions worth one extra attention call (see `temper.engine.planning.attention_chunks`)."""
        per_position = 2 * self.num_kv_heads * self.head_dim * self.cache_dtype_size
        return max(16, (256 * 1024) // per_position)

    @property
    def cache_dtype_size(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()
