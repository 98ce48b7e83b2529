"""`ScriptedEngine`: the tests' one scripted `Engine`. It replays predetermined replies
through the real rollout loop, envs, servers and trainer code, and records what it was
given; `check_token_io` checks a trajectory against those records.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Literal

from temper.engine.base import EngineDefaults, GenerationResult, SampleOutput, SamplingParams
from temper.records import Trajectory
from temper.weights.transport import WeightTransport

#: Text (ended with the eos token), (text, stop id) or (text, stop string: the text ends
#: with it and no stop token follows), or ``(prompt_text, sample_index) -> text``.
Reply = str | tuple[str, int | str] | Callable[[str, int], str]


class ScriptedEngine(EngineDefaults):
    """An Engine that answers with ``replies``, runs no model and records every call.

    ``by = "turn"``: the k-th assistant turn of a conversation (counted in the prompt)
    gets ``replies[k]``: what multi-turn episodes want. ``by = "call"``: each sample
    takes the next reply in order: what servers and judges want. The last reply
    repeats. A reply is cut at ``max_new_tokens`` (finish "length") and at the first
    of the request's stop strings, as a real engine does. Logprobs are distinct
    made-up values; every token gets ``version``.

    Records: ``calls`` (prompt ids, params, sample: one per sample), ``prompts`` and
    ``prompt_ids`` (one per request), ``params``.
    """

    def __init__(
        self,
        tokenizer: Any,
        replies: Sequence[Reply],
        max_context: int = 512,
        delay_s: float = 0.0,
        *,
        by: Literal["turn", "call"] = "turn",
        version: int = 7,
    ) -> None:
        if not replies:
            raise ValueError("ScriptedEngine needs at least one reply")
        self.tokenizer, self.replies, self.by = tokenizer, list(replies), by
        self.max_context, self.delay_s, self.version = max_context, delay_s, version
        self.calls: list[tuple[list[int], SamplingParams, SampleOutput]] = []
        self.prompts: list[str] = []
        self.prompt_ids: list[list[int]] = []
        self.params: list[SamplingParams] = []
        self._next = 0

    def _reply(self, prompt: str, index: int) -> tuple[str, int | str]:
        if self.by == "turn":
            k = prompt.count("<|im_start|>assistant") - 1
        else:
            k, self._next = self._next, self._next + 1
        reply = self.replies[min(k, len(self.replies) - 1)]
        if callable(reply):
            reply = reply(prompt, index)
        return reply if isinstance(reply, tuple) else (reply, self.tokenizer.eos_token_id)

    def _sample(self, prompt_ids: list[int], reply: tuple[str, int | str], params: SamplingParams):
        text, stop = reply
        for s in params.stop_strings:
            if s in text:
                text, stop = text[: text.index(s) + len(s)], s
                break
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        ids += [] if isinstance(stop, str) else [stop]
        finish, stop_reason = "stop", stop
        if len(ids) > params.max_new_tokens:
            ids, finish, stop_reason = ids[: params.max_new_tokens], "length", None
        logprobs = [-(len(prompt_ids) + i) / 1000 for i in range(len(ids))]
        return SampleOutput(ids, logprobs, finish, [self.version] * len(ids), stop_reason)

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> Any:
        await asyncio.sleep(self.delay_s)
        ids = list(prompt_token_ids)
        prompt = self.tokenizer.decode(ids)
        self.prompts.append(prompt)
        self.prompt_ids.append(ids)
        self.params.append(params)
        samples = [self._sample(ids, self._reply(prompt, i), params) for i in range(params.n)]
        self.calls += [(ids, params, s) for s in samples]
        return GenerationResult(ids, samples)

    def load_weights(self, transport: WeightTransport, version: int) -> None:
        transport.receive(version)  # nothing to load; the version is what tests look at
        self.version = version

    async def close(self) -> None:
        return None


Call = tuple[list[int], Any, SampleOutput]


def check_token_io(traj: Trajectory, calls: Sequence[Call]) -> None:
    """The trajectory is exactly what the engine was given and what it sampled."""
    ids = traj.prompt_ids + traj.response_ids
    p = len(traj.prompt_ids)
    assert len(calls) == traj.num_turns == len(traj.turn_spans) > 0
    for (prompt, _, sample), (start, end) in zip(calls, traj.turn_spans, strict=True):
        assert prompt == ids[: p + start]  # the engine's input is the trajectory so far
        assert traj.response_ids[start:end] == sample.token_ids
        assert traj.behaviour_logprobs[start:end] == sample.logprobs
        assert traj.versions[start:end] == sample.policy_versions
        assert traj.loss_mask[start:end] == [1] * (end - start)
    masked = [t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m]
    assert masked == [t for _, _, s in calls for t in s.token_ids]
    for m, lp, v in zip(traj.loss_mask, traj.behaviour_logprobs, traj.versions, strict=True):
        assert m == 1 or (lp == 0.0 and v == -1)


class RecordingProxy(EngineDefaults):
    """Any engine, with every (prompt ids, params, sample) it handles recorded in
    ``calls``: a real engine's episodes checked with `check_token_io`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[Call] = []

    @property
    def version(self) -> int:
        return self.inner.version

    @property
    def max_context(self) -> int:
        return self.inner.max_context

    async def generate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> Any:
        result = await self.inner.generate(prompt_token_ids, params)
        self.calls += [(list(prompt_token_ids), params, s) for s in result.samples]
        return result

    def load_weights(self, transport: WeightTransport, version: int) -> None:
        self.inner.load_weights(transport, version)

    async def close(self) -> None:
        await self.inner.close()
