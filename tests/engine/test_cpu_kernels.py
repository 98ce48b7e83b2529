"""CPU speed paths of the native engine: the fused C decode-attention kernel (agrees
with the PyTorch path, falls back cleanly), rotary-pair weights, huge-page buffers."""

from __future__ import annotations

import logging
import re

import pytest
import torch

from fp32 import ENGINE_PARITY
from temper.engine import cpu_kernels
from temper.engine.base import SamplingParams
from temper.engine.kv_cache import zeros_in_huge_pages
from temper.engine.native import NativeEngine
from temper.weights import push_weights

from .conftest import hf_logprobs, make_model, run


def _reference(qkv, kv, positions, heads, kv_heads, scale):
    """Attention of each row over its positions 0..pos after writing its new key/value."""
    kv = kv.clone()
    b, _, d = qkv.shape
    group = heads // kv_heads
    out = torch.empty(b, heads * d, dtype=torch.float64)
    for r in range(b):
        pos = int(positions[r])
        kv[0, r, :, pos] = qkv[r, heads : heads + kv_heads]
        kv[1, r, :, pos] = qkv[r, heads + kv_heads :]
        for head in range(heads):
            j = head // group
            k, v = kv[0, r, j, : pos + 1].double(), kv[1, r, j, : pos + 1].double()
            p = torch.softmax(k @ qkv[r, head].double() * scale, dim=0)
            out[r, head * d : (head + 1) * d] = p @ v
    return out, kv


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "positions"),
    [
        (4, 2, 16, [0, 7, 8, 9, 63]),  # GQA; lengths around the 8-position blocks
        (3, 3, 12, [5, 17, 30]),  # head size not a multiple of 8 (scalar path)
        (2, 1, 32, [4199]),  # more positions than the kernel's stack buffer
    ],
)
def test_kernel_matches_reference(heads, kv_heads, head_dim, positions) -> None:
    kernel = cpu_kernels.decode_attention()
    assert kernel is not None, "a C compiler is expected on the test machines"
    g = torch.Generator().manual_seed(0)
    b, rows, capacity = len(positions), len(positions) + 2, max(positions) + 3
    qkv = torch.randn(b, heads + 2 * kv_heads, head_dim, generator=g)
    kv = torch.randn(2, rows, kv_heads, capacity, head_dim, generator=g)
    pos = torch.tensor(positions, dtype=torch.int64)
    scale = head_dim**-0.5
    expected, expected_kv = _reference(qkv, kv, pos, heads, kv_heads, scale)
    out = torch.empty(b, heads * head_dim)
    kernel(qkv, kv, pos, out, heads, kv_heads, head_dim, scale)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(kv, expected_kv)  # new keys/values written, nothing else touched


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_engine_with_and_without_kernel_agree(kind: str) -> None:
    model = make_model(kind)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16, 17, 18], [20]]
    params = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)

    async def generate(engine: NativeEngine):
        try:
            return [await engine.generate(p, params) for p in prompts]
        finally:
            await engine.close()

    fused = run(generate(NativeEngine(model, cpu_kernels=True)))
    plain = run(generate(NativeEngine(model, cpu_kernels=False)))
    for a, b in zip(fused, plain, strict=True):
        assert a.samples[0].token_ids == b.samples[0].token_ids
        torch.testing.assert_close(
            torch.tensor(a.samples[0].logprobs),
            torch.tensor(b.samples[0].logprobs),
            **ENGINE_PARITY,
        )


def test_engine_falls_back_when_the_kernel_cannot_be_built(monkeypatch, tmp_path, caplog) -> None:
    monkeypatch.setenv("TEMPER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    cpu_kernels.reset_for_tests()
    try:
        with caplog.at_level(logging.WARNING, logger="temper.engine.cpu_kernels"):
            assert cpu_kernels.decode_attention() is None
        assert "using the PyTorch path" in caplog.text
        engine = NativeEngine(make_model("llama"))
        assert engine._model._attention_kernel is None
        out = run(engine.generate([5, 6, 7], SamplingParams(temperature=0.0, max_new_tokens=5)))
        assert len(out.samples[0].token_ids) == 5
        run(engine.close())
    finally:
        monkeypatch.undo()
        cpu_kernels.reset_for_tests()


def test_kernel_can_be_turned_off_and_builds_once(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TEMPER_CPU_KERNELS", "0")
    cpu_kernels.reset_for_tests()
    try:
        assert cpu_kernels.decode_attention() is None
        monkeypatch.delenv("TEMPER_CPU_KERNELS")
        monkeypatch.setenv("TEMPER_CACHE_DIR", str(tmp_path))
        cpu_kernels.reset_for_tests()
        assert cpu_kernels.decode_attention() is not None
        (built,) = (tmp_path / "kernels").glob("decode_attention-*.so")
        stamp = built.stat().st_mtime_ns
        cpu_kernels.reset_for_tests()
        assert cpu_kernels.decode_attention() is not None
        assert built.stat().st_mtime_ns == stamp  # loaded from the cache, not rebuilt
    finally:
        monkeypatch.undo()
        cpu_kernels.reset_for_tests()


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_updates_reach_rotary_pair_weights(kind: str) -> None:
    """q/k weights, biases (Qwen2) and q/k norms (Qwen3) are stored permuted; an
    update by HF name must land in the right places, partial updates included."""
    engine = NativeEngine(make_model(kind, seed=0))
    other = make_model(kind, seed=1)
    attn = [n for n in other.state_dict() if ".self_attn." in n]
    rest = {n: t for n, t in other.state_dict().items() if n not in attn}
    push_weights(engine, {n: other.state_dict()[n] for n in attn}, version=1)  # part...
    push_weights(engine, rest, version=2)  # ...then the rest
    prompt = [5, 6, 7, 8, 9]
    params = SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True)
    out = run(engine.generate(prompt, params)).samples[0]
    ref = hf_logprobs(other, prompt, out.token_ids)
    torch.testing.assert_close(torch.tensor(out.logprobs), ref, **ENGINE_PARITY)
    name = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(ValueError, match=rf"{re.escape(name)} has shape \(3, 3\)"):
        push_weights(engine, {name: torch.zeros(3, 3)}, version=3)
    run(engine.close())


def test_huge_page_tensors_are_zeroed_and_aligned() -> None:
    big = zeros_in_huge_pages((3, 1 << 20), torch.float32, torch.device("cpu"))
    assert big.shape == (3, 1 << 20) and big.dtype == torch.float32
    assert big.is_contiguous() and not big.any()
    assert big.data_ptr() % (2 << 20) == 0
    small = zeros_in_huge_pages((4, 5), torch.float64, torch.device("cpu"))
    assert small.shape == (4, 5) and small.dtype == torch.float64 and not small.any()
