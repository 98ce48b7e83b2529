"""The ChatML/Hermes chat template used by the built-in tiny model.

Each message renders as `<|im_start|>{role}\\n{content}<|im_end|>\\n`. An
assistant's tool calls follow its content as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (one per call,
newline-separated). A `tool` message renders as
`<|im_start|>tool\\n<tool_response>{content}</tool_response><|im_end|>\\n`. A
`tools` list becomes a system message (merged with the conversation's own
system message, if any) listing one JSON function schema per line. The
generation prompt is `<|im_start|>assistant\\n`; an assistant turn ends with
`<|im_end|>`, the token generation stops on.

Assistant turns are wrapped in `{% generation %}` so
`apply_chat_template(..., return_assistant_tokens_mask=True)` marks them.

`IncrementalRenderer` (below) works with any HF chat template: it renders a
multi-turn conversation piece by piece so sampled ids are never re-tokenised
(see `temper.rollout.multi_turn` and docs/envs.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from temper.errors import TemperError

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
TOOL_CALL = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"

#: Tokens that mark structure (skipped by `decode(..., skip_special_tokens=True)`).
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)
#: Tool markers: single ids, but kept when decoding so tool calls can be parsed.
TOOL_TOKENS: tuple[str, ...] = (TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END)

TOOLS_PREAMBLE = "You can call these tools:\n"
TOOLS_FOOTER = (
    'To call one, reply with <tool_call>{"name": <tool name>, "arguments": <JSON object>}'
    "</tool_call>."
)

CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '" + TOOLS_PREAMBLE.replace("\n", "\\n") + "' }}"
    "{%- for tool in tools %}"
    "{{- (tool.function if tool.function is defined else tool) | tojson }}{{- '\\n' }}"
    "{%- endfor %}"
    "{{- '" + TOOLS_FOOTER + "<|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- if message.tool_calls %}"
    "{%- for tc in message.tool_calls %}"
    "{%- set call = tc.function if tc.function is defined else tc %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>{\"name\": ' + call.name | tojson + ', \"arguments\": ' }}"
    "{%- if call.arguments is string %}{{- call.arguments }}"
    "{%- else %}{{- call.arguments | tojson }}{%- endif %}"
    "{{- '}</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>' }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>tool\\n<tool_response>' + message.content + '</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: The image placeholder of the tiny VLM (LLaVA): one token in the template, expanded by
#: the processor to one token per image patch.
IMAGE_TOKEN = "<image>"

# Content given as OpenAI-style parts renders text parts as their text and image parts
# (`image` or `image_url`) as `<image>`, in order; string content renders as before.
CONTENT_MACRO = (
    "{%- macro render_content(content) %}"
    "{%- if content is string %}{{- content }}"
    "{%- else %}{%- for part in content %}"
    "{%- if part.type == 'text' %}{{- part.text }}"
    "{%- elif part.type in ('image', 'image_url') %}{{- '" + IMAGE_TOKEN + "' }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{%- endmacro %}"
)

#: The ChatML template of `CHATML_TEMPLATE` with content parts (images as `<image>`).
VLM_TEMPLATE = CONTENT_MACRO + CHATML_TEMPLATE.replace(
    "messages[0].content + '\\n\\n' }}",
    "render_content(messages[0].content) + '\\n\\n' }}",
).replace(
    "'<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}",
    "'<|im_start|>system\\n' + render_content(messages[0].content) + '<|im_end|>\\n' }}",
).replace(
    "{{- message.content }}",
    "{{- render_content(message.content) }}",
).replace(
    "<tool_response>' + message.content + '</tool_response>",
    "<tool_response>' + render_content(message.content) + '</tool_response>",
).replace(
    "'\\n' + message.content + '<|im_end|>\\n' }}",
    "'\\n' + render_content(message.content) + '<|im_end|>\\n' }}",
)


# --------------------------------------------------------------------------------------
# Incremental rendering for token-in/token-out multi-turn rollouts (any HF chat template).


class ChatTemplateError(TemperError):
    """A chat template that cannot be rendered incrementally."""


#: Placeholder contents of the dummy conversation used to find template boundaries.
_DUMMY_USER = "temper-dummy-user"
_DUMMY_ASSISTANT = "temper-dummy-assistant"


class IncrementalRenderer:
    """Renders a conversation through a tokenizer's chat template, one piece at a time.

    `prompt(messages)` renders the first observation with the generation
    prompt. After the engine samples an assistant turn, `close_turn(ids)` gives
    what the template still puts after those ids (e.g. ChatML's "\\n" after a
    sampled `<|im_end|>`), and `observation(messages)` gives the tokens of the
    new messages plus the next generation prompt. Sampled ids are never
    re-tokenised.

    How: the template renders a dummy conversation `[user, assistant]` (the
    prefix) and the same conversation followed by the new messages with the
    generation prompt; the new tokens are the second rendering's ids after the
    first's. Both the text and the ids of the prefix must be a true prefix of
    the longer rendering, else `ChatTemplateError` is raised. This assumes, as
    ChatML, Hermes/Qwen and Llama-3 templates do, that how new messages render
    depends on the history only through the preceding assistant turn's role.
    The turn's closing is read off the same dummy: the text the template puts
    after the assistant content (ChatML: `<|im_end|>\\n`), split into the
    end-of-turn ids (up to and including the first stop id: the tokenizer's eos
    or `stop_token_ids`) and the separator after them.
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: list[dict[str, Any]] | None = None,
        stop_token_ids: Iterable[int] = (),
        **template_kwargs: Any,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.template_kwargs = template_kwargs
        stops = set(stop_token_ids)
        if tokenizer.eos_token_id is not None:
            stops.add(int(tokenizer.eos_token_id))
        base = [{"role": "user", "content": _DUMMY_USER}]
        with_prompt = self.render_text(base, add_generation_prompt=True)
        self._prefix = [*base, {"role": "assistant", "content": _DUMMY_ASSISTANT}]
        self._prefix_text = self.render_text(self._prefix, add_generation_prompt=False)
        if not self._prefix_text.startswith(with_prompt + _DUMMY_ASSISTANT):
            raise ChatTemplateError(
                "chat template: an assistant message does not render as the generation prompt "
                "followed by its content, so sampled turns cannot be spliced in"
            )
        self._prefix_ids = self.encode(self._prefix_text)
        closing_text = self._prefix_text[len(with_prompt) + len(_DUMMY_ASSISTANT) :]
        closing = self.encode(closing_text)
        if not closing or self._prefix_ids[-len(closing) :] != closing:
            raise ChatTemplateError(
                f"chat template: the assistant turn's closing {closing_text!r} does not tokenize "
                "on its own as it does in context"
            )
        cut = next((i + 1 for i, t in enumerate(closing) if t in stops), None)
        if cut is None:
            raise ChatTemplateError(
                f"chat template closes an assistant turn with {closing_text!r}, which holds none "
                f"of the stop token ids {sorted(stops)}; pass the end-of-turn id in stop_token_ids"
            )
        #: Ids that end an assistant turn (ChatML: [<|im_end|>]).
        self.end_of_turn_ids: list[int] = closing[:cut]
        #: Ids the template puts after the end of turn, before the next message (ChatML: ["\n"]).
        self.separator_ids: list[int] = closing[cut:]

    def render_text(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=self.tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt(self, messages: list[dict[str, Any]]) -> tuple[list[int], str]:
        """Ids and text of the first observation, ending with the generation prompt."""
        text = self.render_text(messages, add_generation_prompt=True)
        return self.encode(text), text

    def close_turn(self, sampled_ids: Sequence[int]) -> list[int]:
        """Ids to append after a sampled turn so it ends the way the template ends turns.

        The separator if the sample ends with the end-of-turn ids; otherwise
        (length cut, or another stop token) the end-of-turn ids and the separator.
        """
        n = len(self.end_of_turn_ids)
        if n and list(sampled_ids[-n:]) == self.end_of_turn_ids:
            return list(self.separator_ids)
        return [*self.end_of_turn_ids, *self.separator_ids]

    def observation(self, messages: list[dict[str, Any]]) -> list[int]:
        """Ids of `messages` plus the next generation prompt, to follow a closed turn."""
        text = self.render_text([*self._prefix, *messages], add_generation_prompt=True)
        roles = [m.get("role") for m in messages]
        if not text.startswith(self._prefix_text):
            raise ChatTemplateError(
                f"chat template re-renders earlier messages when {roles} are added; it cannot be "
                "rendered incrementally"
            )
        ids = self.encode(text)
        if ids[: len(self._prefix_ids)] != self._prefix_ids:
            raise ChatTemplateError(
                f"tokenizing the conversation with {roles} added changes the tokens of the earlier "
                "messages (a merge across the message boundary); cannot render incrementally"
            )
        return ids[len(self._prefix_ids) :]
