"""`RewardModelReward`: score completions with a learned reward model.

Two modes, same scores:

* ``base_url=...``: over HTTP, against ``temper serve-rm`` (``POST /score``).
  Inputs are sent in requests of up to ``request_size`` pairs, at most
  ``concurrency`` in flight, through the retry logic of
  `temper.http_client.ChatClient` (per-attempt timeout; connection errors,
  timeouts, 429 and 5xx retried with exponential backoff; other 4xx not). A
  request that still fails gives each of its inputs
  ``RewardResult(failure_score, error="reward_model: ... (gave up after N attempt(s))")``.
* ``model=PATH``: in process, with the same dynamic batcher
  (`temper.rewards.rm_batcher.RewardModelBatcher`) and no HTTP. The model loads
  on first use; a batcher is made per event loop.

The score is the model's raw scalar output; ``components`` holds it under the
reward's name.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from temper.http_client import ChatClient, ChatClientError, post_json
from temper.rewards.base import RewardInput, RewardResult


class RewardModelReward:
    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        *,
        name: str = "reward_model",
        failure_score: float = 0.0,
        request_size: int = 32,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        concurrency: int = 8,
        max_batch_size: int = 32,
        max_wait_ms: float = 5.0,
        max_queue: int = 1024,
    ) -> None:
        if (base_url is None) == (model is None):
            raise ValueError("RewardModelReward needs exactly one of base_url= or model=")
        if request_size < 1:
            raise ValueError("request_size must be >= 1")
        self.name = name
        self.failure_score = failure_score
        self.request_size = request_size
        self.model_path = model
        self.base_url = base_url.rstrip("/") if base_url is not None else None
        self.client = ChatClient(
            self.base_url or "in-process",
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            concurrency=concurrency,
        )
        self._batcher_settings = {
            "max_batch_size": max_batch_size,
            "max_wait_ms": max_wait_ms,
            "max_queue": max_queue,
        }
        self._loaded: tuple[Any, Any] | None = None
        self._batcher: Any = None
        self._batcher_loop: asyncio.AbstractEventLoop | None = None

    async def score(self, inputs: list[RewardInput]) -> list[RewardResult]:
        if not inputs:
            return []
        pairs = [(x.prompt_text, x.completion_text) for x in inputs]
        if self.base_url is None:
            scores = await self._local_batcher().score(pairs)
            return [self._ok(s) for s in scores]
        chunks = [pairs[i : i + self.request_size] for i in range(0, len(pairs), self.request_size)]
        async with httpx.AsyncClient(timeout=self.client.timeout_s + 5) as http:
            gate = asyncio.Semaphore(self.client.concurrency)
            done = await asyncio.gather(*(self._send(http, gate, c) for c in chunks))
        return [r for chunk in done for r in chunk]

    def _ok(self, value: float) -> RewardResult:
        return RewardResult(float(value), {self.name: float(value)})

    async def _send(
        self, http: httpx.AsyncClient, gate: asyncio.Semaphore, pairs: list[tuple[str, str]]
    ) -> list[RewardResult]:
        url = f"{self.base_url}/score"

        async def once(payload: dict[str, Any]) -> dict[str, Any]:
            return await post_json(http, url, payload)

        payload = {"pairs": [{"prompt": p, "response": r} for p, r in pairs]}
        try:
            async with gate:
                body = await self.client._with_retries(once, payload)
            scores = body.get("scores") if isinstance(body, dict) else None
            if not isinstance(scores, list) or len(scores) != len(pairs):
                raise ChatClientError(f"reply from {url} has no list of {len(pairs)} scores")
            return [self._ok(float(s)) for s in scores]
        except (ChatClientError, TypeError, ValueError) as exc:
            err = f"{self.name}: {exc}"
            return [RewardResult(self.failure_score, error=err) for _ in pairs]

    def _local_batcher(self) -> Any:
        from temper.rewards.rm_batcher import RewardModelBatcher, load_reward_model

        loop = asyncio.get_running_loop()
        if self._batcher is None or self._batcher_loop is not loop:
            if self._loaded is None:
                assert self.model_path is not None
                self._loaded = load_reward_model(self.model_path)
            self._batcher = RewardModelBatcher(*self._loaded, **self._batcher_settings)
            self._batcher_loop = loop
        return self._batcher

    def close(self) -> None:
        """Stop the in-process batcher, if any. Its worker lives on the loop that scored
        last: the stop is scheduled there when that loop still runs (a loop that has
        ended took its worker with it)."""
        batcher, loop = self._batcher, self._batcher_loop
        self._batcher = self._batcher_loop = None
        if batcher is None or loop is None or loop.is_closed() or not loop.is_running():
            return
        task = loop.create_task(batcher.close())
        _CLOSING.add(task)  # keep a reference until it is done
        task.add_done_callback(_CLOSING.discard)


_CLOSING: set[asyncio.Task] = set()
