"""IncrementalRenderer: the exact rule for appending observations, and clear errors for
templates that cannot be rendered incrementally."""

from __future__ import annotations

from typing import Any

import pytest

from temper.models.chat_template import ChatTemplateError, IncrementalRenderer
from temper.models.loader import load_tokenizer

TOOL_MSG = {"role": "tool", "content": "5"}
USER_MSG = {"role": "user", "content": "And 3 + 4?"}


def tokenizer_with(template: str | None = None) -> Any:
    tokenizer = load_tokenizer("tiny")
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def chatml(after_end: str = "\\n", generation_prompt: str = "<|im_start|>assistant\\n") -> str:
    """Plain ChatML with a configurable text after <|im_end|> and generation prompt."""
    return (
        "{%- for m in messages %}"
        "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>" + after_end + "' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '" + generation_prompt + "' }}{%- endif %}"
    )


def test_tiny_template_rule() -> None:
    tokenizer = tokenizer_with()
    renderer = IncrementalRenderer(tokenizer)
    im_end, newline = tokenizer.eos_token_id, tokenizer.encode("\n")[0]
    assert renderer.end_of_turn_ids == [im_end]
    assert renderer.separator_ids == [newline]
    assert tokenizer.decode(renderer.observation([TOOL_MSG, USER_MSG])) == (
        "<|im_start|>tool\n<tool_response>5</tool_response><|im_end|>\n"
        "<|im_start|>user\nAnd 3 + 4?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.decode(renderer.observation([])) == "<|im_start|>assistant\n"
    sampled = [*tokenizer.encode("2+3=5"), im_end]
    assert renderer.close_turn(sampled) == [newline]
    assert renderer.close_turn(sampled[:-1]) == [im_end, newline]  # cut by length
    assert renderer.close_turn([*sampled[:-1], 0]) == [im_end, newline]  # <|endoftext|>


def test_splicing_equals_whole_rendering() -> None:
    """prompt + sampled turn + close_turn + observation == the template's rendering of
    the whole conversation (with the turn's canonical tokens)."""
    tokenizer = tokenizer_with()
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 3?"}]
    renderer = IncrementalRenderer(tokenizer)
    prompt, text = renderer.prompt(first)
    assert text.endswith("<|im_start|>assistant\n")
    sampled = [*tokenizer.encode("5"), tokenizer.eos_token_id]
    ids = prompt + sampled + renderer.close_turn(sampled) + renderer.observation([USER_MSG])
    conv = [*first, {"role": "assistant", "content": "5"}, USER_MSG]
    whole = tokenizer.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
    assert ids == tokenizer(whole, add_special_tokens=False)["input_ids"]


def test_template_without_separator() -> None:
    tokenizer = tokenizer_with(chatml(after_end=""))
    renderer = IncrementalRenderer(tokenizer)
    assert renderer.end_of_turn_ids == [tokenizer.eos_token_id]
    assert renderer.separator_ids == []
    assert tokenizer.decode(renderer.observation([USER_MSG])).startswith("<|im_start|>user")


def test_stop_token_ids_name_the_end_of_turn() -> None:
    # A template whose turns end with <|endoftext|> (id 0), which is not the eos token.
    template = chatml().replace("<|im_end|>", "<|endoftext|>")
    with pytest.raises(ChatTemplateError, match="none of the stop token ids"):
        IncrementalRenderer(tokenizer_with(template))
    renderer = IncrementalRenderer(tokenizer_with(template), stop_token_ids=[0])
    assert renderer.end_of_turn_ids == [0]


def test_templates_that_cannot_be_rendered_incrementally() -> None:
    # A header that appears once the conversation has more than two messages.
    counts = "{%- if messages | length > 2 %}{{- 'long chat ' }}{%- endif %}" + chatml()
    with pytest.raises(ChatTemplateError, match="re-renders earlier messages"):
        IncrementalRenderer(tokenizer_with(counts)).observation([USER_MSG])
    # "...<|im_end|>\nWh" + "at ..." tokenizes as "What": the prefix's ids change.
    merging = (
        "{%- for m in messages %}"
        "{%- if m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + m.content + '<|im_end|>\\nWh' }}"
        "{%- else %}{{- 'at <|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    with pytest.raises(ChatTemplateError, match="changes the tokens of the earlier messages"):
        IncrementalRenderer(tokenizer_with(merging)).observation([USER_MSG])
    thinking = chatml(generation_prompt="<|im_start|>assistant\\n<think>")
    with pytest.raises(ChatTemplateError, match="generation prompt"):
        IncrementalRenderer(tokenizer_with(thinking))
