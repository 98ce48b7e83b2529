"""The built-in tiny chat model: files, tokenizer, chat template, loader, decoding."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from temper.errors import ModelLoadError
from temper.models import TINY_DIR, load_model, load_tokenizer, resolve_model_path
from temper.models.chat_template import SPECIAL_TOKENS, TOOL_TOKENS

ALL_SPECIAL = (*SPECIAL_TOKENS, *TOOL_TOKENS)


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(TINY_DIR)


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    return AutoModelForCausalLM.from_pretrained(TINY_DIR).eval()


def test_shipped_files_and_size() -> None:
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
    ):
        assert (TINY_DIR / name).is_file(), name
    size = sum(p.stat().st_size for p in TINY_DIR.iterdir() if p.is_file())
    assert size < 25 * 1024 * 1024
    gen = json.loads((TINY_DIR / "generation_config.json").read_text())
    cfg = json.loads((TINY_DIR / "tokenizer_config.json").read_text())
    assert "chat_template" in cfg
    assert cfg["eos_token"] == "<|im_end|>"
    assert cfg["pad_token"] == "<|endoftext|>"
    assert gen["pad_token_id"] is not None
    assert len(gen["eos_token_id"]) == 2


def test_param_count_and_config(model) -> None:  # type: ignore[no-untyped-def]
    n = sum(p.numel() for p in model.parameters())
    assert 1_000_000 <= n <= 10_000_000
    assert model.config.tie_word_embeddings
    assert model.config.max_position_embeddings == 512
    assert next(model.parameters()).dtype == torch.float32


def test_special_tokens_are_single_ids(tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = set()
    for tok in ALL_SPECIAL:
        enc = tokenizer.encode(tok, add_special_tokens=False)
        assert len(enc) == 1, tok
        ids.add(enc[0])
    assert len(ids) == len(ALL_SPECIAL)
    assert tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.pad_token_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert len(tokenizer) == tokenizer.backend_tokenizer.get_vocab_size()
    gen = json.loads((TINY_DIR / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tokenizer.eos_token_id, tokenizer.pad_token_id]


def test_digits_tokenize_individually(tokenizer) -> None:  # type: ignore[no-untyped-def]
    ids = tokenizer.encode("12345 + 678", add_special_tokens=False)
    pieces = [tokenizer.decode([i]) for i in ids]
    digits = [p.strip() for p in pieces if any(c.isdigit() for c in p)]
    assert digits == list("12345678")
    text = "Any text: é, 漢字, {x}!\n"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_chat_template_exact(tokenizer) -> None:  # type: ignore[no-untyped-def]
    conv = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "2+3=5. \\boxed{5}"},
    ]
    assert tokenizer.apply_chat_template(conv, tokenize=False) == (
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n2+3=5. \\boxed{5}<|im_end|>\n"
    )
    prompt = tokenizer.apply_chat_template(conv[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    system = [{"role": "system", "content": "Be brief."}, *conv[:1]]
    assert tokenizer.apply_chat_template(system, tokenize=False).startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
    )


def test_chat_template_tools(tokenizer) -> None:  # type: ignore[no-untyped-def]
    tool = {
        "type": "function",
        "function": {"name": "calculator", "parameters": {"type": "object"}},
    }
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"x": "1+1"}}}
    conv = [
        {"role": "user", "content": "Add."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "2"},
    ]
    text = tokenizer.apply_chat_template(
        conv, tools=[tool], tokenize=False, add_generation_prompt=True
    )
    assert text.startswith('<|im_start|>system\nYou can call these tools:\n{"name": "calculator"')
    assert text.endswith(
        "<|im_start|>user\nAdd.<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "calculator", "arguments": {"x": "1+1"}}'
        "</tool_call><|im_end|>\n"
        "<|im_start|>tool\n<tool_response>2</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    enc = tokenizer.apply_chat_template(
        conv[:2], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    masked = [i for i, m in zip(enc["input_ids"], enc["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(masked).startswith("<tool_call>")
    assert masked[-1] == tokenizer.eos_token_id


def test_resolve_model_path(tmp_path: Path) -> None:
    assert resolve_model_path("tiny") == TINY_DIR
    assert resolve_model_path("builtin:tiny") == TINY_DIR
    assert resolve_model_path(str(tmp_path)) == tmp_path
    missing = tmp_path / "nope"
    with pytest.raises(ModelLoadError, match="nope") as info:
        resolve_model_path(str(missing))
    assert "\n" not in str(info.value)
    with pytest.raises(ModelLoadError):
        load_model(str(tmp_path))


def test_alias_loads_and_greedy_decodes_well_formed() -> None:
    model, tokenizer = load_model("tiny"), load_tokenizer("builtin:tiny")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True
    )
    ids = torch.tensor([list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)])
    out = model.generate(ids, max_new_tokens=40, do_sample=False)
    new = out[0, ids.shape[1] :].tolist()
    assert tokenizer.eos_token_id in new
    text = tokenizer.decode(new[: new.index(tokenizer.eos_token_id)])
    assert re.search(r"\\boxed\{\d+\}$", text), text
