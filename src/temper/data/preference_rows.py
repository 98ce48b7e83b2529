"""Preference pairs for DPO (``trainer.mode = "dpo"``): rows, their checks, their tokens.

A `PreferenceRow` is a prompt and two answers to it, the chosen (preferred) and the
rejected one, each as chat messages. `load_preference_rows` reads them from a
dataset file (.jsonl, .json, .parquet) through `temper.data.datasets`:

- ``prompt``: a string (one user message) or a non-empty list of chat messages,
  which may hold a conversation's earlier turns but does not end with an assistant;
- ``chosen`` and ``rejected``: a string (one assistant message) or a non-empty
  list of chat messages starting with an assistant message (TRL's conversational
  format with an explicit prompt).

A row without one of them, or with a value of another type, raises `DataError`
naming the file, the row and the field (the CLI prints it as one line, exit 2).
`tiny_rm_rows` gives the built-in pairs the tiny reward model was trained on
(`temper.data.preferences`), split by prompt content as there.

`render_pair` turns a row into two trajectories through the chat template, with
the same ``prompt_ids`` (so the trainer runs the prompt once for both) and the
loss mask on the answer's assistant tokens only (`ConversationRenderer`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from temper.data.conversations import _ROLES, Conversation, ConversationRenderer
from temper.data.preferences import make_pairs, user_text
from temper.errors import DataError
from temper.records import Trajectory


@dataclass
class PreferenceRow:
    id: str
    prompt: list[dict[str, Any]]
    chosen: list[dict[str, Any]]
    rejected: list[dict[str, Any]]


def load_preference_rows(
    path: str, prompt_field: str = "prompt", chosen_field: str = "chosen",
    rejected_field: str = "rejected",
) -> list[PreferenceRow]:  # fmt: skip
    """One `PreferenceRow` per row of ``path``; `DataError` on a row that is not one."""
    from temper.data.datasets import _id_prefix, _read_source

    label, rows = _read_source(path, None)
    if not rows:
        raise DataError(f"{label}: dataset is empty")
    prefix = _id_prefix(label)
    out = []
    for index, (where, row) in enumerate(rows):
        at = f"{label} {where}"
        prompt = _prompt(_field(row, prompt_field, at), prompt_field, at)
        chosen = _answer(_field(row, chosen_field, at), chosen_field, at)
        rejected = _answer(_field(row, rejected_field, at), rejected_field, at)
        out.append(PreferenceRow(f"{prefix}-{index}", prompt, chosen, rejected))
    return out


def _field(row: Mapping[str, Any], field: str, at: str) -> Any:
    if field not in row:
        available = ", ".join(sorted(map(str, row))) or "none"
        raise DataError(f"{at}: missing field {field!r} (available: {available})")
    if row[field] is None:  # a null in a parquet column, say
        raise DataError(f"{at}: field {field!r} is null")
    return row[field]


def _messages(value: Any, field: str, at: str, what: str) -> list[dict[str, Any]]:
    """``value`` as chat messages: a non-empty string is one message of ``what``'s role."""
    role = "user" if what == "prompt" else "assistant"
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{at}: field {field!r} is empty")
        return [{"role": role, "content": value}]
    if not isinstance(value, list) or not value:
        raise DataError(
            f"{at}: field {field!r} must be a string or a non-empty list of chat messages, "
            f"got {type(value).__name__}"
        )
    for i, m in enumerate(value):
        if not isinstance(m, Mapping) or m.get("role") not in _ROLES:
            raise DataError(
                f"{at}: field {field!r} message {i} must be a dict with a 'role' of "
                f"{', '.join(_ROLES)}"
            )
        content = m.get("content")
        if not (isinstance(content, str) or (content is None and m.get("tool_calls"))):
            raise DataError(f"{at}: field {field!r} message {i} has no text 'content'")
    return [dict(m) for m in value]


def _prompt(value: Any, field: str, at: str) -> list[dict[str, Any]]:
    messages = _messages(value, field, at, "prompt")
    if messages[-1]["role"] == "assistant":
        raise DataError(
            f"{at}: field {field!r} ends with an assistant message (the answers would "
            "continue it); end the prompt with a user, system or tool message"
        )
    return messages


def _answer(value: Any, field: str, at: str) -> list[dict[str, Any]]:
    messages = _messages(value, field, at, "answer")
    if messages[0]["role"] != "assistant":
        raise DataError(f"{at}: field {field!r} must start with an assistant message")
    return messages


def tiny_rm_rows(n: int, *, heldout: bool, seed: int) -> list[PreferenceRow]:
    """``n`` of the tiny reward model's synthetic pairs from one split (`make_pairs`), the
    prompt as plain user text (the policy's template renders it)."""
    split = "heldout" if heldout else "train"
    return [
        PreferenceRow(
            f"tiny-rm-{split}-{i}",
            [{"role": "user", "content": user_text(p.prompt)}],
            [{"role": "assistant", "content": p.chosen}],
            [{"role": "assistant", "content": p.rejected}],
        )
        for i, p in enumerate(make_pairs(n, heldout=heldout, seed=seed))
    ]


def render_pair(
    renderer: ConversationRenderer, row: PreferenceRow, index: int, max_tokens: int | None = None
) -> tuple[Trajectory, Trajectory]:
    """(chosen, rejected) trajectories of ``row``, group ``index``; `DataError` when one
    does not fit in ``max_tokens``."""
    out = []
    for side, answer in (("chosen", row.chosen), ("rejected", row.rejected)):
        conv = Conversation(f"{row.id}-{side}", [*row.prompt, *answer])
        t = renderer.render(conv, max_tokens, train_from=len(row.prompt))
        t.task_id, t.group_id = row.id, index
        out.append(t)
    chosen, rejected = out
    assert chosen.prompt_ids == rejected.prompt_ids  # one prompt, rendered piece by piece
    return chosen, rejected
