"""A distillation teacher behind a server: `RemoteTeacher` (``distill.teacher = URL``).

The teacher is any OpenAI-compatible completions server that scores given tokens:
``POST /v1/completions`` with a token-id ``prompt``, ``echo = true``,
``max_tokens = 0`` and ``logprobs = 0`` answers with each prompt token's logprob
given the ones before it (`temper serve`, `temper.serve.scoring`; vLLM's server
answers the same request). The orchestrator sends each trajectory's prompt and
response ids once, after the step's advantages, and keeps the response part in
`Trajectory.teacher_logprobs`; the trainer turns those into per-token advantages
as it does an in-process teacher's. The trainer then holds no teacher, and the
teacher's forwards run on the server's hardware, not the trainer's.

At start `connect` checks what a wrong teacher would otherwise hide: that the
server answers, serves the model, scores, and gives the student's token ids the
same meaning (a probe of the student's own chat-formatted ids, compared token
string by token string). Each failure is one `ConfigError` line (exit 2).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx

from temper.engine.openai_endpoint import EndpointError, list_models
from temper.errors import ConfigError, TemperError
from temper.http_client import ChatClientError, post_json
from temper.records import Trajectory

#: Sequences per scoring request, and requests in flight at once.
BATCH, CONCURRENCY = 8, 4
PROBE = "What is 12 + 30? Answer: 42. Then 7 * 6 = 0123456789, the end!"


class TeacherError(TemperError):
    """The teacher server failed or answered something that is not a score."""


def completions_url(url: str) -> str:
    """``url`` as the base of its ``/v1`` routes (``http://h:p`` or ``http://h:p/v1``)."""
    base = url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


class RemoteTeacher:
    """Scores trajectories through ``{base}/completions``; see the module docstring."""

    def __init__(self, url: str, model_name: str, timeout_s: float = 120.0) -> None:
        self.url, self.base, self.model_name = url, completions_url(url), model_name
        self.timeout_s = timeout_s

    @classmethod
    def connect(
        cls, url: str, tokenizer: Any, model_name: str | None = None, timeout_s: float = 120.0
    ) -> RemoteTeacher:
        """A teacher checked against ``tokenizer`` (the student's); `ConfigError` if not."""
        try:  # no API key: a teacher Temper serves, or one on a private network
            ids = [m["id"] for m in list_models(completions_url(url), "none", timeout_s)]
        except EndpointError as exc:
            raise ConfigError(f"distill.teacher {url!r} does not list its models: {exc}") from None
        if model_name is not None and model_name not in ids:
            raise ConfigError(
                f"distill.teacher_model {model_name!r} is not served at {url!r} (it serves {ids})"
            )
        if not ids:
            raise ConfigError(f"distill.teacher {url!r} serves no model")
        teacher = cls(url, model_name or ids[0], timeout_s)
        teacher._check_tokenizer(tokenizer)
        return teacher

    def _check_tokenizer(self, tokenizer: Any) -> None:
        """The server's reading of the student's probe ids must be the student's own."""
        msgs = [{"role": "user", "content": PROBE}]
        try:
            text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        except (ValueError, AttributeError):  # a base model without a chat template
            text = PROBE
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        try:  # at start, before any event loop runs: a plain blocking request
            reply = httpx.post(
                f"{self.base}/completions", json=self._payload([ids]), timeout=self.timeout_s
            )
            if reply.status_code >= 400:
                raise TeacherError(f"HTTP {reply.status_code}: {reply.text[:300]}")
            choice = self._choices(reply.json(), [ids])[0]
        except (httpx.HTTPError, ValueError) as exc:
            raise ConfigError(f"distill.teacher {self.url!r} does not answer: {exc!r}") from None
        except TeacherError as exc:
            raise ConfigError(
                f"distill.teacher {self.url!r} cannot score given tokens: {exc}"
            ) from None
        theirs = choice["logprobs"]["tokens"]
        ours = [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
        if theirs != ours:
            k = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), 0)
            got = theirs[k] if k < len(theirs) else "nothing"
            raise ConfigError(
                f"distill.teacher {self.url!r} has another tokenizer than the student: token "
                f"id {ids[k]} is {ours[k]!r} to the student and {got!r} to the teacher; the "
                "teacher scores the student's token ids, so they must mean the same to it"
            )

    def _payload(self, prompts: list[list[int]]) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "prompt": prompts,
            "max_tokens": 0,
            "echo": True,
            "logprobs": 0,
        }

    def _choices(self, body: Any, prompts: list[list[int]]) -> list[dict[str, Any]]:
        """The reply's choices in order, each with one logprob entry per prompt token."""
        try:
            choices = sorted(body["choices"], key=lambda c: c["index"])
        except (KeyError, TypeError) as exc:
            raise TeacherError(f"the reply has no choices: {exc!r}") from None
        if len(choices) != len(prompts):
            raise TeacherError(f"{len(choices)} choices for {len(prompts)} prompts")
        for choice, ids in zip(choices, prompts, strict=True):
            lps = (choice.get("logprobs") or {}).get("token_logprobs")
            if not isinstance(lps, list) or len(lps) != len(ids):
                n = len(lps) if isinstance(lps, list) else "no"
                raise TeacherError(f"{n} token logprobs for a prompt of {len(ids)} tokens")
        return choices

    async def _post(self, http: httpx.AsyncClient, prompts: list[list[int]]) -> list[dict]:
        try:
            body = await post_json(http, f"{self.base}/completions", self._payload(prompts))
        except ChatClientError as exc:
            raise TeacherError(str(exc)) from None
        return self._choices(body, prompts)

    async def score(self, trajs: list[Trajectory]) -> None:
        """Set ``teacher_logprobs`` (one per response token) on each of ``trajs``."""
        gate = asyncio.Semaphore(CONCURRENCY)

        async def batch(http: httpx.AsyncClient, rows: list[Trajectory]) -> None:
            async with gate:
                choices = await self._post(http, [t.prompt_ids + t.response_ids for t in rows])
            for t, choice in zip(rows, choices, strict=True):
                lps = choice["logprobs"]["token_logprobs"][len(t.prompt_ids) :]
                if not all(isinstance(x, int | float) and math.isfinite(x) for x in lps):
                    raise TeacherError(f"trajectory {t.task_id}: a response token has no logprob")
                t.teacher_logprobs = [float(x) for x in lps]

        todo = [t for t in trajs if t.response_ids]
        async with httpx.AsyncClient(timeout=self.timeout_s) as http:
            batches = [todo[k : k + BATCH] for k in range(0, len(todo), BATCH)]
            await asyncio.gather(*[batch(http, rows) for rows in batches])
