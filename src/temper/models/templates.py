"""Which chat template a run renders prompts with: ``model.chat_template``.

``auto``
    the tokenizer's own template; a tokenizer without one is refused with one
    line naming the setting (a base model: use ``raw`` or a template).
``raw``
    plain text, for base models: the tokenizer's start tokens (its BOS, where
    it adds one to any text), then each message's content, messages separated
    by a blank line. There is no generation prompt: the completion continues
    the prompt's text. An assistant message is its content (tool calls in the
    Hermes ``<tool_call>`` form) followed by the eos token, with no blank line
    before it, so a multi-turn episode is the observations and the sampled
    turns in order, each sampled turn ending with eos and the next observation
    after a blank line. A ``tools`` list is written first, as plain text.
a built-in name
    ``chatml`` (`CHATML_TEMPLATE`, the built-in tiny model's). Its
    ``<|im_start|>`` and ``<|im_end|>`` must be single tokens of the tokenizer.
a path to a ``.jinja`` file
    an HF chat template.

`install_chat_template` sets the chosen template on the tokenizer the run
made once (`temper.builder.model.RunModel`): everything that renders prompts
(single-turn prompts, `IncrementalRenderer` in episodes, SFT conversations,
serving) then uses it, and a checkpoint saves it with the tokenizer. Prompts
are still rendered once and sampled ids are never re-tokenised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from temper.errors import ConfigError
from temper.models.chat_template import (
    CHATML_TEMPLATE,
    CONTENT_MACRO,
    IM_END,
    IM_START,
    TOOLS_FOOTER,
    TOOLS_PREAMBLE,
)

AUTO = "auto"
RAW = "raw"

#: Named templates ``model.chat_template`` may choose.
BUILTIN_TEMPLATES: dict[str, str] = {"chatml": CHATML_TEMPLATE}

#: The tokens each built-in template needs as single tokens of the tokenizer.
_NEEDS: dict[str, tuple[str, ...]] = {"chatml": (IM_START, IM_END)}

_RAW_BODY = (
    CONTENT_MACRO + "{%- if tools %}"
    "{{- '" + TOOLS_PREAMBLE.replace("\n", "\\n") + "' }}"
    "{%- for tool in tools %}"
    "{{- (tool.function if tool.function is defined else tool) | tojson }}{{- '\\n' }}"
    "{%- endfor %}"
    "{{- '" + TOOLS_FOOTER + "' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{%- generation %}"
    "{%- if message.content %}{{- render_content(message.content) }}{%- endif %}"
    "{%- for tc in message.tool_calls or [] %}"
    "{%- set call = tc.function if tc.function is defined else tc %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>{\"name\": ' + call.name | tojson + ', \"arguments\": ' }}"
    "{%- if call.arguments is string %}{{- call.arguments }}"
    "{%- else %}{{- call.arguments | tojson }}{%- endif %}"
    "{{- '}</tool_call>' }}"
    "{%- endfor %}"
    "{%- if eos_token %}{{- eos_token }}{%- endif %}"
    "{%- endgeneration %}"
    "{%- else %}"
    "{%- if not loop.first or tools %}{{- '\\n\\n' }}{%- endif %}"
    "{{- render_content(message.content) }}"
    "{%- endif %}"
    "{%- endfor %}"
)


def raw_template(tokenizer: Any) -> str:
    """The ``raw`` template for ``tokenizer``: its start tokens, then the plain text."""
    start = start_text(tokenizer)
    head = "{% raw %}" + start + "{% endraw %}" if start else ""
    return head + _RAW_BODY


def start_text(tokenizer: Any) -> str:
    """The text of the special tokens the tokenizer puts before any text (a BOS), or ""."""
    plain = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    full = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    n = len(full) - len(plain)
    if n <= 0 or full[n:] != plain:
        return ""
    return "".join(tokenizer.convert_ids_to_tokens(full[:n]))


def install_chat_template(tokenizer: Any, setting: str, model: str, required: bool = True) -> None:
    """Set the template ``setting`` (``model.chat_template``) chooses on ``tokenizer``.

    ``auto`` keeps the tokenizer's own; without one, ``required`` raises a one-line
    `ConfigError` (a process that renders no prompts, such as a server whose
    chat endpoint reports it per request, passes False). Raises `ConfigError`
    for a template file that is missing or not a valid template, and for a
    built-in template whose special tokens the tokenizer lacks.
    """
    if setting == AUTO:
        if required and not tokenizer.chat_template:
            raise ConfigError(
                f"model {model!r} has no chat template (a base model?); set "
                'model.chat_template = "raw" (plain-text prompts), "chatml" or a .jinja file'
            )
        return
    if setting == RAW:
        tokenizer.chat_template = raw_template(tokenizer)
    elif setting in BUILTIN_TEMPLATES:
        _check_tokens(tokenizer, setting, model)
        tokenizer.chat_template = BUILTIN_TEMPLATES[setting]
    else:
        tokenizer.chat_template = _read_template(setting)
        _check_renders(tokenizer, setting)


def _check_tokens(tokenizer: Any, name: str, model: str) -> None:
    vocab = tokenizer.get_vocab()
    missing = [t for t in _NEEDS[name] if t not in vocab]
    if missing:
        raise ConfigError(
            f"model.chat_template = {name!r} needs the tokens {', '.join(missing)}, which the "
            f'tokenizer of {model!r} lacks; use "raw" or a .jinja file written for this model'
        )


def _read_template(setting: str) -> str:
    names = ", ".join(repr(n) for n in (AUTO, RAW, *BUILTIN_TEMPLATES))
    path = Path(setting).expanduser()
    if path.suffix != ".jinja":
        raise ConfigError(
            f"model.chat_template = {setting!r} is neither {names} nor a path to a .jinja file"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConfigError(f"model.chat_template: cannot read {setting!r}: {reason}") from None
    if not text.strip():
        raise ConfigError(f"model.chat_template: {setting!r} is empty")
    return text


def _check_renders(tokenizer: Any, setting: str) -> None:
    """Refuse a template file that cannot render a one-message prompt (its syntax, mostly)."""
    try:
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
        )
    except Exception as exc:  # jinja's errors, and whatever the template raises
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise ConfigError(
            f"model.chat_template: {setting!r} cannot render a user message: "
            f"{' '.join(lines) or type(exc).__name__}"
        ) from None
