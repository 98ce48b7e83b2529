"""`OpenAIEndpointEngine`: the Engine protocol over an OpenAI-compatible `/v1/completions`.

For evaluating a model served elsewhere (`temper serve`, vLLM, SGLang, a hosted
API). Each `generate` is one `POST {base_url}/completions` whose `prompt` is
the list of prompt token ids, with `n`, `temperature`, `top_p`, `max_tokens`,
`stop`, `seed`, `logprobs=0` and the extensions `return_token_ids` (Temper and
vLLM answer with each choice's sampled ids), `top_k`, `stop_token_ids` and
`ignore_eos` (sent only when set).

Token ids: when a choice carries `token_ids` they are used as they are, with
the returned per-token logprobs. Otherwise the choice's text is re-encoded with
the local tokenizer and the sample is marked `retokenized=True`: the ids are
then not necessarily the ones sampled (and lack the stop token), and logprobs
are NaN unless the server's logprobs list has exactly as many entries.

It cannot take weight updates (`update_weights` raises), so it serves eval and
rollout-only runs, never training. Requests go through
`temper.http_client.ChatClient` (per-attempt timeout, retries on connection
errors, 429 and 5xx).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import httpx

from temper.engine.base import (
    EngineAbilities,
    EngineDefaults,
    FinishReason,
    GenerationResult,
    SampleOutput,
    SamplingParams,
)
from temper.errors import ConfigError, TemperError
from temper.http_client import ChatClient, ChatClientError
from temper.weights.transport import WeightTransport


class EndpointError(TemperError):
    """The endpoint could not be reached, refused a request, or answered nonsense."""


def list_models(base_url: str, api_key: str, timeout_s: float) -> list[dict[str, Any]]:
    """`GET {base_url}/models`: the served models (their ids, maybe `max_model_len`)."""
    url = f"{base_url}/models"
    try:
        reply = httpx.get(url, headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout_s)
        reply.raise_for_status()
        data = reply.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise EndpointError(f"cannot list models at {url}: {exc}") from None
    return [m for m in data if isinstance(m, dict) and "id" in m]


class OpenAIEndpointEngine(EngineDefaults):
    """Token ids in, token ids + logprobs out, through a remote completions endpoint.

    `model_name` is the id sent with each request; by default the first model that
    `GET {base_url}/models` lists. `max_context` defaults to that model's
    `max_model_len` (Temper and vLLM report it), else the tokenizer's
    `model_max_length`. The API key is sent as a bearer token. One HTTP session
    per event loop, closed by `close()`.
    """

    abilities = EngineAbilities(weight_updates=False)

    def __init__(
        self,
        base_url: str,
        tokenizer: Any,
        *,
        model_name: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        concurrency: int = 64,
        max_context: int | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.tokenizer = tokenizer
        self.version = 0
        key = api_key or "EMPTY"
        self.client = ChatClient(
            self.base_url,
            key,
            timeout_s=timeout_s,
            max_retries=max_retries,
            concurrency=concurrency,
            path="/completions",
        )
        cards = list_models(self.base_url, key, min(timeout_s, 30.0))
        card = next((c for c in cards if model_name is None or c["id"] == model_name), None)
        if model_name is None and card is None:
            raise EndpointError(f"{self.base_url}/models lists no model; set engine.model_name")
        self.model_name = model_name if model_name is not None else card["id"]
        limit = max_context or (card or {}).get("max_model_len")
        limit = limit or getattr(tokenizer, "model_max_length", None)
        if not isinstance(limit, int) or limit > 10**7:  # HF's "no limit" sentinel is huge
            raise EndpointError(
                f"cannot tell the context length of {self.model_name!r} at {self.base_url}; "
                "pass max_context"
            )
        self.max_context = limit
        self._session: Any = None
        self._send: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _payload(self, prompt_ids: Sequence[int], p: SamplingParams) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model_name,
            "prompt": [int(i) for i in prompt_ids],
            "n": p.n,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "max_tokens": p.max_new_tokens,
            "logprobs": 0,
            "return_token_ids": True,
        }
        if p.stop_strings:
            payload["stop"] = list(p.stop_strings)
        if p.seed is not None:
            payload["seed"] = p.seed
        if p.top_k:
            payload["top_k"] = p.top_k
        if p.stop_token_ids:
            payload["stop_token_ids"] = list(p.stop_token_ids)
        if p.ignore_eos:
            payload["ignore_eos"] = True
        return payload

    async def _sender(self) -> Any:
        """The session of the running loop (a new loop gets a new session)."""
        loop = asyncio.get_running_loop()
        if self._send is None or self._loop is not loop:
            self._session = self.client.session()
            self._send = await self._session.__aenter__()
            self._loop = loop
        return self._send

    async def generate(
        self, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> GenerationResult:
        """One completions request for `params.n` samples of `prompt_token_ids`."""
        send = await self._sender()
        try:
            reply = await send(self._payload(prompt_token_ids, params))
        except ChatClientError as exc:
            raise EndpointError(f"{self.base_url}/completions: {exc}") from None
        choices = reply.get("choices") if isinstance(reply, dict) else None
        if not isinstance(choices, list) or len(choices) != params.n:
            got = len(choices) if isinstance(choices, list) else "no"
            raise EndpointError(
                f"{self.base_url}/completions answered {got} choices for n={params.n}"
            )
        choices = sorted(choices, key=lambda c: c.get("index", 0))
        samples = [self._sample(c, params) for c in choices]
        return GenerationResult(list(prompt_token_ids), samples)

    def _sample(self, choice: dict[str, Any], params: SamplingParams) -> SampleOutput:
        ids = choice.get("token_ids")
        retokenized = not isinstance(ids, list)
        if retokenized:
            text = choice.get("text") or ""
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        lps = (choice.get("logprobs") or {}).get("token_logprobs")
        if not isinstance(lps, list) or len(lps) != len(ids):
            lps = [math.nan] * len(ids)
        finish: FinishReason = choice.get("finish_reason") or "stop"
        if finish not in ("stop", "length"):
            finish = "abort" if finish == "abort" else "stop"
        stop = choice.get("stop_reason")
        if stop is None and finish == "stop" and ids and not retokenized:
            last = ids[-1]
            if last == self.tokenizer.eos_token_id or last in params.stop_token_ids:
                stop = last
        lps = [math.nan if v is None else float(v) for v in lps]
        versions = [self.version] * len(ids)
        return SampleOutput([int(i) for i in ids], lps, finish, versions, stop, retokenized)

    def load_weights(self, transport: WeightTransport, version: int) -> None:
        """Always raises: the remote model's weights are not ours to change."""
        raise ConfigError(
            f"engine.type = 'openai' ({self.base_url}) cannot take weight updates: "
            "use it for eval or rollout-only runs"
        )

    async def close(self) -> None:
        """Close the HTTP session of the current loop (if one is open)."""
        session, self._session, self._send = self._session, None, None
        if session is not None and self._loop is asyncio.get_running_loop():
            await session.__aexit__(None, None, None)
        self._loop = None
