"""One agent episode's record: token-exact rows built from OpenAI-style calls.

An agent sends messages, not ids. The gateway (`temper.serve.gateway`) renders
each request through the chat template, and `AgentSession.plan` decides which
ids the engine is fed, given what the session already holds:

- **Extension.** The rendered ids start with the current row's ids (its
  prompt, every sampled turn and every observation so far): the new ids after
  them are an observation (loss mask 0) and the call continues the row.
- **Splice.** The ids differ, but the request's messages are the row's
  messages so far (what the agent sent last time plus what the model answered)
  followed by new ones. Re-rendering drifted: a re-spaced tool call, text the
  template drops (earlier `<think>` blocks), or a decode/encode round trip that
  is not a bijection. With ``splice`` on (the default) the engine is fed the
  row's exact ids, the template's turn closing and the new messages rendered
  incrementally (`IncrementalRenderer`), so the model sees exactly what it
  sampled, as in Temper's own env episodes; the drift is counted as a repair
  with its cause. With ``splice`` off the call starts a new row and the drift
  is counted as a break.
- **Break.** The messages do not extend the row's (the agent edited or
  dropped history, or started another conversation): a new row starts, and
  the break is counted with its cause.

Causes: ``respaced_tool_call``, ``template_dropped_text``, ``retokenized``,
``edited_history``, ``new_conversation``. The session is pure bookkeeping: no
I/O, no engine; the gateway calls `plan` before and `record` after each
generation, one call at a time (its lock).
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from temper.engine.base import SampleOutput
from temper.models.chat_template import ChatTemplateError, IncrementalRenderer

CAUSES = (
    "respaced_tool_call",
    "template_dropped_text",
    "retokenized",
    "edited_history",
    "new_conversation",
)


@dataclass
class Row:
    """One token-exact training row: a prompt and the calls that extended it."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    #: The conversation so far, normalised (`normal_message`), the last answer included.
    messages: list[dict[str, Any]] = field(default_factory=list)
    #: The same conversation as the agent sent it (for logs and judges).
    raw_messages: list[dict[str, Any]] = field(default_factory=list)
    #: The ids the template rendered for the last call (before any splice).
    last_render: list[int] = field(default_factory=list)
    last_sample: list[int] = field(default_factory=list)
    last_tool_calls: bool = False
    finish_reason: str = "stop"

    def ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add_observation(self, ids: list[int]) -> None:
        self.response_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def add_sample(self, sample: SampleOutput, fallback_version: int) -> None:
        n = len(sample.token_ids)
        start = len(self.response_ids)
        self.response_ids += sample.token_ids
        self.loss_mask += [1] * n
        self.logprobs += [float(x) for x in sample.logprobs]
        self.versions += list(sample.policy_versions or [fallback_version] * n)
        self.turn_spans.append((start, start + n))
        self.last_sample = list(sample.token_ids)
        self.finish_reason = sample.finish_reason


def normal_message(message: dict[str, Any]) -> dict[str, Any]:
    """What two messages must share to be the same turn: role, text and tool calls
    (name and parsed arguments). Ids, spacing of the arguments' JSON, and an empty
    content against a missing one do not count."""
    content = message.get("content")
    if isinstance(content, list):  # content parts: their texts, in order
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        args = fn.get("arguments")
        if isinstance(args, str):
            with contextlib.suppress(ValueError):
                args = json.loads(args)
        calls.append({"name": fn.get("name"), "arguments": args})
    return {"role": message.get("role"), "content": (content or "").strip(), "tool_calls": calls}


@dataclass
class Plan:
    """What `AgentSession.plan` decided for one call."""

    ids: list[int]
    #: "extend", "splice" or "new_row".
    kind: str
    cause: str | None = None
    observation: list[int] = field(default_factory=list)


class AgentSession:
    """The record of one agent episode (see the module doc)."""

    def __init__(self, session_id: str, tokenizer: Any, splice: bool = True) -> None:
        self.id = session_id
        self.tokenizer = tokenizer
        self.splice = splice
        self.rows: list[Row] = []
        self.breaks: Counter[str] = Counter()
        self.repairs: Counter[str] = Counter()
        self.calls = 0
        self.generated = 0
        self._renderers: dict[str, IncrementalRenderer] = {}
        self._pending: Plan | None = None

    def _renderer(self, tools: list[dict[str, Any]] | None) -> IncrementalRenderer:
        key = json.dumps(tools, sort_keys=True)
        if key not in self._renderers:
            self._renderers[key] = IncrementalRenderer(self.tokenizer, tools)
        return self._renderers[key]

    def plan(
        self,
        rendered: list[int],
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> Plan:
        """The ids to feed the engine for a call whose request rendered to ``rendered``."""
        row = self.rows[-1] if self.rows else None
        normal = [normal_message(m) for m in messages]
        if row is None:
            plan = Plan(list(rendered), "new_row")
        elif rendered[: len(row.ids())] == row.ids():
            plan = Plan(list(rendered), "extend", observation=rendered[len(row.ids()) :])
        elif len(normal) > len(row.messages) and normal[: len(row.messages)] == row.messages:
            plan = self._drifted(row, rendered, messages[len(row.messages) :], tools)
        else:
            same_start = bool(normal and row.messages and normal[0] == row.messages[0])
            cause = "edited_history" if same_start else "new_conversation"
            plan = Plan(list(rendered), "new_row", cause)
        self._pending = plan
        return plan

    def _drifted(
        self,
        row: Row,
        rendered: list[int],
        new_messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> Plan:
        """Same conversation, different ids: repair by splicing, or break (``splice`` off)."""
        try:
            renderer = self._renderer(tools)
            tail = renderer.close_turn(row.last_sample) + renderer.observation(new_messages)
        except ChatTemplateError:  # this template cannot render incrementally: re-render
            tail = []
        spliced = row.ids() + tail
        cause = self._cause(row, rendered, tail)
        if not self.splice or not tail:
            return Plan(list(rendered), "new_row", cause)
        return Plan(spliced, "splice", cause, observation=tail)

    def _cause(self, row: Row, rendered: list[int], tail: list[int]) -> str | None:
        """Why the template's ids for the last turn differ from the sampled ones; None
        when this turn renders as sampled (an earlier turn's drift, already counted)."""
        last = row.last_render
        if rendered[: len(last)] == last and rendered[len(last) :] == row.last_sample + tail:
            return None
        decode = self.tokenizer.decode
        sampled = decode(row.last_sample, skip_special_tokens=True).strip()
        shown = decode(rendered[len(last) :] if rendered[: len(last)] == last else rendered)
        if sampled and sampled not in shown:
            return "respaced_tool_call" if row.last_tool_calls else "template_dropped_text"
        return "retokenized"

    def record(
        self,
        sample: SampleOutput,
        messages: list[dict[str, Any]],
        answer: dict[str, Any],
        rendered: list[int],
        fallback_version: int,
    ) -> None:
        """Add the planned call and its sample: to the current row or a new one."""
        plan, self._pending = self._pending, None
        assert plan is not None, "record() without plan()"
        if plan.kind == "new_row":
            self.rows.append(Row(prompt_ids=plan.ids))
        # Counted only for calls that happened (a refused call leaves no trace).
        if plan.cause is not None:
            (self.breaks if plan.kind == "new_row" else self.repairs)[plan.cause] += 1
        row = self.rows[-1]
        row.add_observation(plan.observation)
        row.add_sample(sample, fallback_version)
        row.raw_messages = [*messages, answer]
        row.messages = [normal_message(m) for m in row.raw_messages]
        row.last_render = list(rendered)
        row.last_tool_calls = bool(answer.get("tool_calls"))
        self.calls += 1
        self.generated += len(sample.token_ids)

    def cancel(self) -> None:
        """The planned call did not happen (refused or cut off): forget the plan."""
        self._pending = None

    def metrics(self) -> dict[str, float]:
        """Per-episode counters (summed over a step by `episode_stats`)."""
        out = {"agent_calls": float(self.calls), "agent_rows": float(len(self.rows))}
        for cause, n in self.breaks.items():
            out[f"agent_break_{cause}"] = float(n)
        for cause, n in self.repairs.items():
            out[f"agent_repair_{cause}"] = float(n)
        return out
