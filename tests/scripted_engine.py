"""`ScriptedEngine`: a real `Engine` that replays predetermined assistant replies.

Tests use it to force exact model outputs (tool calls, answers) through the
real rollout loop, env and trainer code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from temper.engine.base import EngineDefaults, GenerationResult, SampleOutput, SamplingParams
from temper.weights.transport import WeightTransport


class ScriptedEngine(EngineDefaults):
    """An Engine whose k-th assistant turn in a conversation is `replies[k]`.

    A reply is text (tokenized, then ended with `<|im_end|>`), (text, stop id), or
    (text, stop string): the text ends with the stop string and no stop token follows.
    It is cut at `max_new_tokens` with finish reason "length", like a real engine.
    Logprobs are distinct made-up values; every token gets `version`.
    """

    def __init__(
        self,
        tokenizer: Any,
        replies: Sequence[str | tuple[str, int | str]],
        max_context: int = 512,
        delay_s: float = 0.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.max_context = max_context
        self.delay_s = delay_s
        self.version = 7

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> Any:
        await asyncio.sleep(self.delay_s)
        turn = self.tokenizer.decode(list(prompt_token_ids)).count("<|im_start|>assistant") - 1
        reply = self.replies[min(turn, len(self.replies) - 1)]
        text, stop = reply if isinstance(reply, tuple) else (reply, self.tokenizer.eos_token_id)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        ids += [] if isinstance(stop, str) else [stop]
        finish, stop_reason = "stop", stop
        if len(ids) > params.max_new_tokens:
            ids, finish, stop_reason = ids[: params.max_new_tokens], "length", None
        logprobs = [-(len(prompt_token_ids) + i) / 1000 for i in range(len(ids))]
        sample = SampleOutput(ids, logprobs, finish, [self.version] * len(ids), stop_reason)
        return GenerationResult(list(prompt_token_ids), [sample])

    def load_weights(self, transport: WeightTransport, version: int) -> None:
        transport.receive(version)  # nothing to load; the version is what tests look at
        self.version = version

    async def close(self) -> None:
        return None
