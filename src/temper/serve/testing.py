"""`RecordingEngine`: a real Engine that answers with scripted text and records prompts.

For tests of anything that talks to `temper serve` (the LLM judge, tool-call
round trips): the replies are fixed, so results are deterministic, and every
prompt the engine received is kept (ids and decoded text), so a test can check
exactly what a client sent after the chat template rendered it. It runs no
model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from temper.engine.base import GenerationResult, SampleOutput, SamplingParams

Reply = str | Callable[[str, int], str]


class RecordingEngine:
    """Replies with ``replies`` in order (one per sample; the last one repeats).

    A reply is text, or a function ``(prompt_text, sample_index) -> text``.
    The text is tokenised and ended with the tokenizer's eos id (finish
    "stop"); it is cut at ``max_new_tokens`` (finish "length") and at the
    first stop string (finish "stop", the text up to and including it).
    ``prompts`` holds the decoded text of every prompt, ``prompt_ids`` the ids.
    """

    def __init__(
        self,
        tokenizer: Any,
        replies: Sequence[Reply],
        *,
        max_context: int = 512,
        delay_s: float = 0.0,
    ) -> None:
        if not replies:
            raise ValueError("RecordingEngine needs at least one reply")
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.max_context = max_context
        self.delay_s = delay_s
        self.version = 0
        self.prompts: list[str] = []
        self.prompt_ids: list[list[int]] = []
        self.params: list[SamplingParams] = []
        self._next = 0

    def _reply(self, prompt: str, index: int) -> str:
        reply = self.replies[min(self._next, len(self.replies) - 1)]
        self._next += 1
        return reply(prompt, index) if callable(reply) else reply

    def _sample(self, text: str, params: SamplingParams) -> SampleOutput:
        stop: int | str | None = self.tokenizer.eos_token_id
        for s in params.stop_strings:
            if s in text:
                text, stop = text[: text.index(s) + len(s)], s
                break
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if not isinstance(stop, str):
            ids.append(int(stop))
        finish = "stop"
        if len(ids) > params.max_new_tokens:
            ids, finish, stop = ids[: params.max_new_tokens], "length", None
        logprobs = [-0.5] * len(ids)
        return SampleOutput(ids, logprobs, finish, [self.version] * len(ids), stop)

    async def generate(
        self, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> GenerationResult:
        await asyncio.sleep(self.delay_s)
        prompt = self.tokenizer.decode(list(prompt_token_ids), skip_special_tokens=False)
        self.prompts.append(prompt)
        self.prompt_ids.append(list(prompt_token_ids))
        self.params.append(params)
        samples = [self._sample(self._reply(prompt, i), params) for i in range(params.n)]
        return GenerationResult(list(prompt_token_ids), samples)

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        self.version = version

    async def close(self) -> None:
        return None
