"""Structured output, declared: what a sample's text must be, not how to enforce it.

A `StructuredOutput` on `temper.engine.base.SamplingParams` says the text is one
JSON value under a schema (``kind="json"``) or one Hermes tool call,
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (``kind="tool_call"``),
whose object follows the call schema that `tool_call_output` builds from the
tools. Both are compact: the JSON has no free whitespace, so a weak model cannot
spend its tokens on blanks.

Who enforces it: an engine with ``abilities.structured_outputs`` (vLLM: its own
structured outputs, `temper.engine.vllm_structured`) takes the declaration
itself; for any other engine the caller turns it into `logits_processors`
(`temper.serve.grammar`, an xgrammar mask per sample). Both build the same
grammar (`xgrammar_grammar`), so both engines produce the same shape.

xgrammar is imported only when a grammar is built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class StructuredOutput:
    """The shape a sample's text must take. ``schema`` is JSON text (hashable; key
    order kept, as it is the order the JSON's properties come in): the value's
    schema for ``"json"``, the call object's for ``"tool_call"``. ``field`` names
    where it came from (e.g. a request field), for error messages."""

    kind: Literal["json", "tool_call"]
    schema: str
    field: str = ""

    @property
    def schema_dict(self) -> dict[str, Any]:
        return dict(json.loads(self.schema))


def json_output(schema: dict[str, Any], field: str = "") -> StructuredOutput:
    """One JSON value valid under ``schema``."""
    return StructuredOutput("json", json.dumps(schema), field)


def tool_call_output(tools: list[dict[str, Any]], field: str = "") -> StructuredOutput:
    """One Hermes ``<tool_call>`` block calling one of ``tools`` (OpenAI tool dicts),
    its arguments valid under that tool's parameter schema."""
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": t["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
        }
        for t in tools
    ]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return StructuredOutput("tool_call", json.dumps(schema), field)


def xgrammar_grammar(output: StructuredOutput) -> Any:
    """The `xgrammar.Grammar` of ``output`` (raises xgrammar's error for a schema it
    cannot take)."""
    import xgrammar as xgr

    body = xgr.Grammar.from_json_schema(output.schema, any_whitespace=False)
    if output.kind == "json":
        return body
    return xgr.Grammar.concat(
        xgr.Grammar.from_ebnf('root ::= "<tool_call>"'),
        body,
        xgr.Grammar.from_ebnf('root ::= "</tool_call>"'),
    )


__all__ = ["StructuredOutput", "json_output", "tool_call_output", "xgrammar_grammar"]
