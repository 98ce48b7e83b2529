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
"""

from __future__ import annotations

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
