"""Conversations for supervised fine-tuning (``trainer.mode = "sft"``).

A conversation is a list of OpenAI-style chat messages. `render_conversation`
turns one into a `Trajectory` with the token layout a multi-turn rollout has:
``prompt_ids`` are the messages before the first assistant turn and the
generation prompt; ``response_ids`` the rest, with ``loss_mask`` 1 exactly on
the assistant turns' tokens (their content and the end-of-turn token the
engine stops on) and 0 on everything the model did not write (later user or
tool messages, generation prompts, the separator after an end of turn). So an
SFT step trains through the same micro-batching, packing and loss masking as
an RL step.

Each piece is the difference between two renderings of the chat template
(the conversation up to a turn, with and without it), tokenized on its own,
as a rollout tokenizes a turn. A template that re-renders earlier messages
when one is added cannot be split this way and is refused.

`load_conversations` reads a dataset file through `temper.data.datasets`
(.jsonl, .json, .parquet); a bad row raises `DataError` naming the file, the
row and the field. `arithmetic_conversations` makes a small dataset by code:
arithmetic questions of the training split answered with their worked
solutions.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from temper.data.arithmetic import ArithmeticTasks, worked_solution
from temper.errors import DataError
from temper.models.chat_template import IncrementalRenderer
from temper.records import Trajectory

_ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Conversation:
    id: str
    messages: list[dict[str, Any]]


def load_conversations(path: str, messages_field: str = "messages") -> list[Conversation]:
    """One `Conversation` per row of ``path``; `DataError` on a row that is not one."""
    from temper.data.datasets import _id_prefix, _read_source

    label, rows = _read_source(path, None)
    if not rows:
        raise DataError(f"{label}: dataset is empty")
    prefix = _id_prefix(label)
    out = []
    for index, (where, row) in enumerate(rows):
        at = f"{label} {where}"
        out.append(Conversation(f"{prefix}-{index}", _messages(row, messages_field, at)))
    return out


def _messages(row: Mapping[str, Any], field: str, at: str) -> list[dict[str, Any]]:
    if field not in row:
        available = ", ".join(sorted(map(str, row))) or "none"
        raise DataError(f"{at}: missing field {field!r} (available: {available})")
    value = row[field]
    if not isinstance(value, list) or not value:
        raise DataError(f"{at}: field {field!r} must be a non-empty list of chat messages")
    for i, m in enumerate(value):
        if not isinstance(m, Mapping) or m.get("role") not in _ROLES:
            raise DataError(
                f"{at}: field {field!r} message {i} must be a dict with a 'role' of "
                f"{', '.join(_ROLES)}"
            )
        content = m.get("content")
        if not (isinstance(content, str) or (content is None and m.get("tool_calls"))):
            raise DataError(f"{at}: field {field!r} message {i} has no text 'content'")
    roles = [m["role"] for m in value]
    if "assistant" not in roles:
        raise DataError(f"{at}: field {field!r} has no assistant message (nothing to learn)")
    if roles[0] == "assistant":
        raise DataError(f"{at}: field {field!r} starts with an assistant message (no prompt)")
    return [dict(m) for m in value]


def arithmetic_conversations(
    n: int, levels: Sequence[int] = (1, 2, 3), seed: int = 0
) -> list[Conversation]:
    """``n`` arithmetic questions (training split: never a held-out problem), each
    answered with its correct worked solution ending in ``\\boxed{N}``."""
    tasks = ArithmeticTasks(levels=levels, seed=seed)
    rng = random.Random(f"sft:{seed}")
    out = []
    for i in range(n):
        problem = tasks.sample_problem(rng)
        messages = [
            {"role": "user", "content": problem.prompt},
            {"role": "assistant", "content": worked_solution(problem)},
        ]
        out.append(Conversation(f"arith-sft-{i}", messages))
    return out


class ConversationRenderer:
    """Renders conversations through a tokenizer's chat template (see the module docstring)."""

    def __init__(self, tokenizer: Any, system_prompt: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        # The end-of-turn ids and the separator after them, as multi-turn rollouts see them.
        self.turns = IncrementalRenderer(tokenizer)

    def _text(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False
        )

    def render(
        self, conv: Conversation, max_tokens: int | None = None, train_from: int = 0
    ) -> Trajectory:
        """``conv`` as a trajectory with the loss on its assistant turns from message
        ``train_from`` on; earlier assistant turns are part of the prompt (a preference
        pair's prompt may hold a conversation's history)."""
        messages = conv.messages
        if self.system_prompt and not any(m["role"] == "system" for m in messages):
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
            if train_from:
                train_from += 1  # the same messages, one place further on
        ids: list[int] = []
        mask: list[int] = []
        prompt_len = None
        done = ""  # the text rendered so far
        for i, m in enumerate(messages):
            if m["role"] != "assistant" or i < train_from:
                continue
            before = self._text(messages[:i], add_generation_prompt=True)
            through = self._text(messages[: i + 1], add_generation_prompt=False)
            if not before.startswith(done) or not through.startswith(before):
                raise DataError(
                    f"conversation {conv.id}: the chat template re-renders earlier messages "
                    f"at message {i}, so its assistant tokens cannot be marked"
                )
            ids += self.turns.encode(before[len(done) :])
            mask += [0] * (len(ids) - len(mask))
            if prompt_len is None:
                prompt_len = len(ids)
            turn = self.turns.encode(through[len(before) :])
            mask += [1] * len(turn)
            sep = self.turns.separator_ids
            if sep and turn[-len(sep) :] == sep:
                mask[len(mask) - len(sep) :] = [0] * len(sep)
            ids += turn
            done = through
        assert prompt_len is not None  # load_conversations refuses rows without assistant turns
        while mask[-1] == 0:  # the separator after the last turn: nothing to predict there
            ids.pop()
            mask.pop()
        if max_tokens is not None and len(ids) > max_tokens:
            raise DataError(
                f"conversation {conv.id}: {len(ids)} tokens, longer than the model context "
                f"({max_tokens} tokens)"
            )
        response = ids[prompt_len:]
        n = len(response)
        return Trajectory(
            task_id=conv.id,
            group_id=0,
            prompt_ids=ids[:prompt_len],
            response_ids=response,
            loss_mask=mask[prompt_len:],
            behaviour_logprobs=[0.0] * n,
            versions=[-1] * n,
            finish_reason="stop",
            prompt_text=self.tokenizer.decode(ids[:prompt_len]),
            response_text=self.tokenizer.decode(response),
            num_turns=sum(m["role"] == "assistant" for m in messages),
            messages=messages,
        )
