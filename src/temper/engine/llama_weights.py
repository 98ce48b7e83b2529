"""The native engine's copy of a Llama-family model's weights.

`LlamaWeights` copies an HF model's weights into one buffer in transparent huge
pages (see `temper.engine.kv_cache.zeros_in_huge_pages`), fused for the forward
(q/k/v and gate/up each one transposed matrix, so a projection is one plain
GEMM), and keeps, for each HF parameter name, the views it lives in, so weight
updates by HF name are copied in place (`load_state_dict`).

The q and k dimensions of each head are stored in rotary-pair order: HF rotates
dimension i with dimension i + D/2, the engine stores them side by side
(2i, 2i + 1), so RoPE is one complex multiplication (`rope_table`). Dot
products between q and k are unchanged by the common permutation.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from temper.engine.kv_cache import zeros_in_huge_pages

#: Weights start at multiples of this many elements in the arena (64 bytes in float32).
_ALIGN = 16


class LlamaWeights:
    """Fused engine copies of an HF Llama-family model's weights (cast to ``dtype``).

    Attributes used by the forward: ``embed``, ``lm_head`` (transposed),
    ``final_norm``, ``layers`` (one dict per layer: ``ln1``, ``ln2``, ``qkv``,
    ``qkv_b``, ``o``, ``o_b``, ``gate_up``, ``gate_up_b``, ``down``, ``down_b``,
    ``q_norm``, ``k_norm``; absent parts are None) and ``intermediate``. Later
    changes to the HF model do not reach this object except through
    `load_state_dict`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        dtype: torch.dtype,
        device: torch.device,
        heads: tuple[int, int, int],
        qk_norm: bool,
    ) -> None:
        self.dtype, self.device = dtype, device
        self.num_heads, self.num_kv_heads, self.head_dim = heads
        self.qk_norm = qk_norm
        sd = {k: v.detach() for k, v in model.state_dict().items()}
        # HF name -> the engine tensors (views) holding it; tied weights have two.
        self._views: dict[str, list[torch.Tensor]] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        # The embedding is counted twice: a tied LM head gets its own transposed copy.
        numel = sum(t.numel() for t in sd.values()) + sd["model.embed_tokens.weight"].numel()
        self._arena = zeros_in_huge_pages((numel + _ALIGN * (len(sd) + 1),), dtype, device)
        self._arena_used = 0
        tied = (
            "lm_head.weight" not in sd
            or sd["lm_head.weight"].data_ptr() == sd["model.embed_tokens.weight"].data_ptr()
            or bool(getattr(model.config, "tie_word_embeddings", False))
        )
        with torch.no_grad():
            self._build(sd, int(model.config.num_hidden_layers), tied)

    def _own(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of ``t`` in the weight arena (cast to the engine's dtype)."""
        start = -(-self._arena_used // _ALIGN) * _ALIGN
        end = start + t.numel()
        if end > self._arena.numel():  # not expected; stay correct regardless
            return t.to(device=self.device, dtype=self.dtype).clone()
        self._arena_used = end
        return self._arena[start:end].view(t.shape).copy_(t)

    def _register(self, name: str, view: torch.Tensor, hf_shape: torch.Size) -> None:
        """Record that HF tensor ``name`` (of ``hf_shape``) lives in ``view``.

        ``view`` has the HF tensor's shape, or, for the rotary-pair layout (see
        `_pairs_from_hf`), a shape the HF tensor reshapes to.
        """
        self._views.setdefault(name, []).append(view)
        self._shapes[name] = tuple(hf_shape)

    def _pairs_from_hf(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """HF q/k projection rows (or q/k norm weights) in the engine's rotary-pair order.

        HF rotates dimension i of a head with dimension i + D/2; the engine stores
        them side by side (2i, 2i + 1), so RoPE is one complex multiplication.
        Other tensors pass through unchanged.
        """
        heads = self._pair_heads(name)
        if heads is None:
            return t
        half = self.head_dim // 2
        rest = t.shape[1:] if heads else ()
        lead = (heads,) if heads else ()
        return t.reshape(*lead, 2, half, *rest).transpose(len(lead), len(lead) + 1).reshape(t.shape)

    def _pair_view(self, name: str, view: torch.Tensor) -> torch.Tensor:
        """The engine-order ``view`` of ``name`` reshaped so HF's tensor, reshaped alike, lines up."""
        heads = self._pair_heads(name)
        if heads is None:
            return view
        half = self.head_dim // 2
        lead = (heads,) if heads else ()
        paired = view.view(*lead, half, 2, *view.shape[1:])
        return paired.transpose(len(lead), len(lead) + 1)

    def _pair_heads(self, name: str) -> int | None:
        """Heads of a tensor stored in rotary-pair order (0 for a per-head-dim norm), else None."""
        for suffix, heads in (("q_proj", self.num_heads), ("k_proj", self.num_kv_heads)):
            if f"self_attn.{suffix}." in name:
                return heads
        if name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
            return 0
        return None

    def _fused(self, sd: Mapping[str, torch.Tensor], names: list[str]) -> torch.Tensor:
        """Concatenate biases ``names`` along dim 0 and register each part as a view."""
        fused = self._own(torch.cat([self._pairs_from_hf(n, sd[n]) for n in names], dim=0))
        start = 0
        for n in names:
            rows = sd[n].shape[0]
            self._register(n, self._pair_view(n, fused[start : start + rows]), sd[n].shape)
            start += rows
        return fused

    def _fused_t(self, sd: Mapping[str, torch.Tensor], names: list[str]) -> torch.Tensor:
        """Weights ``names`` ([out_i, in] each) as one transposed ``[in, sum out_i]`` matrix.

        Transposed weights let a linear layer run as a plain ``x @ w`` GEMM.
        """
        parts = [self._pairs_from_hf(n, sd[n]) for n in names]
        fused = self._own(torch.cat(parts, dim=0).t().contiguous())
        start = 0
        for n in names:
            rows = sd[n].shape[0]
            self._register(n, self._pair_view(n, fused[:, start : start + rows].t()), sd[n].shape)
            start += rows
        return fused

    def _single(self, sd: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
        t = self._own(self._pairs_from_hf(name, sd[name]))
        self._register(name, self._pair_view(name, t), sd[name].shape)
        return t

    def _build(self, sd: Mapping[str, torch.Tensor], num_layers: int, tied: bool) -> None:
        self.embed = self._single(sd, "model.embed_tokens.weight")
        if tied:
            self.lm_head = self._fused_t(sd, ["model.embed_tokens.weight"])
            self._views["lm_head.weight"] = self._views["model.embed_tokens.weight"]
            self._shapes["lm_head.weight"] = self._shapes["model.embed_tokens.weight"]
        else:
            self.lm_head = self._fused_t(sd, ["lm_head.weight"])
        self.final_norm = self._single(sd, "model.norm.weight")
        self.layers: list[dict[str, torch.Tensor | None]] = []
        for i in range(num_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            qkv = [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"]
            qkv_b = [a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"]
            layer: dict[str, torch.Tensor | None] = {
                "ln1": self._single(sd, p + "input_layernorm.weight"),
                "ln2": self._single(sd, p + "post_attention_layernorm.weight"),
                "qkv": self._fused_t(sd, qkv),
                "qkv_b": self._fused(sd, qkv_b) if qkv_b[0] in sd else None,
                "o": self._fused_t(sd, [a + "o_proj.weight"]),
                "o_b": self._single(sd, a + "o_proj.bias") if a + "o_proj.bias" in sd else None,
                "gate_up": self._fused_t(sd, [m + "gate_proj.weight", m + "up_proj.weight"]),
                "gate_up_b": (
                    self._fused(sd, [m + "gate_proj.bias", m + "up_proj.bias"])
                    if m + "gate_proj.bias" in sd
                    else None
                ),
                "down": self._fused_t(sd, [m + "down_proj.weight"]),
                "down_b": self._single(sd, m + "down_proj.bias")
                if m + "down_proj.bias" in sd
                else None,
                "q_norm": self._single(sd, a + "q_norm.weight") if self.qk_norm else None,
                "k_norm": self._single(sd, a + "k_norm.weight") if self.qk_norm else None,
            }
            self.layers.append(layer)
        self.intermediate: int = self.layers[0]["down"].shape[0]  # type: ignore[union-attr]

    def parameter_names(self) -> list[str]:
        return list(self._views)

    def read(self, name: str) -> torch.Tensor:
        """A copy of HF tensor ``name`` as HF lays it out (undoing the fusion and the
        rotary-pair order); `KeyError` for a name the engine does not hold."""
        if name not in self._views:
            raise KeyError(f"update_weights: unknown parameter name {name!r}")
        # The view lines up element by element with the HF tensor reshaped to its shape.
        return self._views[name][0].reshape(self._shapes[name]).clone()

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        """Copy tensors (HF names) into the engine's weights in place; returns how many.

        A subset of names is allowed. Unknown names and shape mismatches raise
        `KeyError` / `ValueError` before anything is copied.
        """
        unknown = [n for n in state_dict if n not in self._views and not n.endswith("inv_freq")]
        if unknown:
            raise KeyError(f"update_weights: unknown parameter name(s) {unknown[:5]}")
        for name, t in state_dict.items():
            if name in self._views and tuple(t.shape) != self._shapes[name]:
                raise ValueError(
                    f"update_weights: {name} has shape {tuple(t.shape)}, "
                    f"expected {self._shapes[name]}"
                )
        with torch.no_grad():
            count = 0
            for name, t in state_dict.items():
                for view in self._views.get(name, ()):
                    view.copy_(t.reshape(view.shape))
                    count += 1
        return count


def rope_table(
    model: torch.nn.Module,
    max_context: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """``cos + i sin`` per position and rotary pair, ``[max_context, head_dim / 2]``.

    Complex128 for a float64 model, else complex64 (rotation runs in float32).
    """
    rotary = model.model.rotary_emb
    inv_freq = getattr(rotary, "original_inv_freq", None)
    if inv_freq is None:
        inv_freq = rotary.inv_freq
    scaling = float(getattr(rotary, "attention_scaling", 1.0))
    pos = torch.arange(max_context, device=device, dtype=torch.float32)
    # Same float32 arithmetic as the HF rotary embedding, so tables match bitwise.
    freqs = pos[:, None] * inv_freq.to(device=device, dtype=torch.float32)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * scaling
    sin = emb.sin() * scaling
    half = head_dim // 2
    # With dimensions i and i + D/2 stored as the pair (re, im), HF's
    # x * cos + rotate_half(x) * sin is x * (cos + i sin).
    table = torch.complex(cos[:, :half], sin[:, :half])
    return table.to(torch.complex128) if dtype == torch.float64 else table
