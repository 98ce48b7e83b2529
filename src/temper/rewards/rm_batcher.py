"""In-process reward-model scoring: load a sequence-classification model, and batch
its forwards dynamically (`RewardModelBatcher`).

`RewardModelBatcher` queues (prompt, response) pairs; a worker task collects
up to ``max_batch_size`` of them, or waits at most ``max_wait_ms`` after the
oldest one arrived, and scores them with `temper.rewards.rm_scoring` on the
compute thread (`temper.compute.arun`): one tokenizer call, rows sorted by
token length, one padded forward of an `AutoModelForSequenceClassification`
(with one label) per group of similar lengths. Each pair's future gets its
scalar score, or the error that pair alone causes: a bad pair fails only its
own request. The queue is bounded (``max_queue`` pairs): when full, new
requests fail at once with `Overloaded`; a request of more than
``max_queue`` pairs fails with `TooManyPairs`. `close()` fails every pending
pair with `BatcherClosed` instead of leaving it hanging.

The `reward_model` reward runs one in process (`temper.rewards.reward_model`);
`temper serve-rm` puts HTTP in front of one (`temper.serve.reward_model`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temper import compute
from temper.errors import ModelLoadError
from temper.rewards.rm_scoring import UnscorablePair, score_pairs_each


class Overloaded(Exception):
    """The batcher's queue is full; the request was not queued."""


class BatcherClosed(Exception):
    """The batcher shut down before (or while) scoring the pair."""


class TooManyPairs(ValueError):
    """A request with more pairs than the whole queue holds: it can never be queued."""


def load_reward_model(path: str | Path) -> tuple[Any, Any]:
    """(model, tokenizer) of a one-label sequence-classification model at ``path``.

    ``path`` is a directory or a built-in alias (``tiny-rm``: the shipped tiny
    reward model, see `temper.models.loader`).
    The model is loaded on the compute thread, in eval mode; a missing pad token
    falls back to EOS so batches can be padded.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from temper.models.loader import ALIASES

    directory = ALIASES.get(str(path)) or Path(path).expanduser()
    if not directory.is_dir():
        raise ModelLoadError(
            f"reward model path {str(path)!r} does not exist or is not a directory"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
        model = compute.run(AutoModelForSequenceClassification.from_pretrained, directory)
    except (OSError, ValueError) as exc:
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), repr(exc))
        raise ModelLoadError(f"cannot load a reward model from {str(path)!r}: {first}") from exc
    if model.config.num_labels != 1:
        raise ModelLoadError(
            f"reward model {str(path)!r} has num_labels={model.config.num_labels}; need 1"
        )
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise ModelLoadError(f"tokenizer of {str(path)!r} has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


def _index_of(items: list[_Item], exc: BaseException) -> int:
    """Which item's future failed with ``exc``; marks every failure as retrieved."""
    failed = [
        i
        for i, it in enumerate(items)
        if it.future.done() and not it.future.cancelled() and it.future.exception() is exc
    ]
    return failed[0] if failed else -1


@dataclass
class _Item:
    prompt: str
    response: str
    future: asyncio.Future
    arrived: float


class RewardModelBatcher:
    """Dynamic batching of reward-model forwards on one event loop.

    Use from a single event loop: `start()` there (or let the first `score`
    start it), `close()` there. ``forwards`` counts model forwards and
    ``scored`` counts pairs scored.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 32,
        max_wait_ms: float = 5.0,
        max_queue: int = 1024,
        max_length: int | None = None,
    ) -> None:
        if max_batch_size < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError("need max_batch_size >= 1, max_queue >= 1 and max_wait_ms >= 0")
        self.model, self.tokenizer = model, tokenizer
        self.max_batch_size, self.max_wait_ms, self.max_queue = (
            max_batch_size,
            max_wait_ms,
            max_queue,
        )
        if max_length is None:
            max_length = getattr(model.config, "max_position_embeddings", None)
        self.max_length = max_length
        self.forwards = 0
        self.scored = 0
        self._items: deque[_Item] = deque()
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._closed = False

    @property
    def pending(self) -> int:
        """Pairs queued and not yet taken into a batch."""
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> None:
        """Start the worker task on the running loop (idempotent)."""
        if self._closed:
            raise BatcherClosed("reward-model batcher is closed")
        if self._worker is None:
            self._wake = asyncio.Event()
            self._worker = asyncio.get_running_loop().create_task(self._run())

    async def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        """Scores of ``pairs`` (all queued together, or none: `Overloaded` when full).

        A pair that fails on its own fails the call with its error
        (`UnscorablePair` or `RuntimeError`); pairs of other calls batched
        with it are scored as usual. `TooManyPairs`: more pairs than
        ``max_queue``, so the call could never succeed.
        """
        if not pairs:
            return []
        self.start()
        if len(pairs) > self.max_queue:
            raise TooManyPairs(
                f"request has {len(pairs)} pairs, more than the queue holds (max_queue="
                f"{self.max_queue}); send at most {self.max_queue} per request"
            )
        if len(self._items) + len(pairs) > self.max_queue:
            raise Overloaded(
                f"reward-model queue is full ({len(self._items)} pairs queued, "
                f"max_queue={self.max_queue}); retry later"
            )
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        items = [_Item(p, r, loop.create_future(), now) for p, r in pairs]
        was_empty = not self._items
        self._items.extend(items)
        assert self._wake is not None
        # Wake the worker only when it has something new to decide: the first
        # pair (start the wait) or a full batch (stop waiting). Not per request.
        if was_empty or len(self._items) >= self.max_batch_size:
            self._wake.set()
        try:
            if len(items) == 1:  # the common case; gather would add a task per request
                return [await items[0].future]
            return list(await asyncio.gather(*(it.future for it in items)))
        except BaseException as exc:
            for it in items:  # a cancelled or failed request: drop its other pairs too
                if not it.future.done():
                    it.future.cancel()
            if isinstance(exc, UnscorablePair):  # name the pair
                raise UnscorablePair(f"pairs.{_index_of(items, exc)}: {exc}") from None
            raise

    async def close(self) -> None:
        """Stop the worker; pending pairs fail with `BatcherClosed`."""
        self._closed = True
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        self._fail(list(self._items), "reward-model server is shutting down")
        self._items.clear()

    @staticmethod
    def _fail(items: list[_Item], message: str) -> None:
        for it in items:
            if not it.future.done():
                it.future.set_exception(BatcherClosed(message))

    async def _collect(self) -> list[_Item]:
        assert self._wake is not None
        while not self._items:
            self._wake.clear()
            await self._wake.wait()
        deadline = self._items[0].arrived + self.max_wait_ms / 1000
        while len(self._items) < self.max_batch_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):  # no extra task, unlike wait_for
                    await self._wake.wait()
        batch: list[_Item] = []
        while self._items and len(batch) < self.max_batch_size:
            it = self._items.popleft()
            if not it.future.done():  # skip pairs of cancelled requests
                batch.append(it)
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            if not batch:
                continue
            pairs = [(it.prompt, it.response) for it in batch]
            try:
                results = await compute.arun(
                    score_pairs_each, self.model, self.tokenizer, pairs, self.max_length
                )
            except asyncio.CancelledError:
                self._fail(batch, "reward-model server is shutting down")
                raise
            except Exception as exc:  # a bug outside any one pair
                results = [RuntimeError(f"reward-model forward failed: {exc!r}")] * len(batch)
            self.forwards += 1
            for it, result in zip(batch, results, strict=True):
                if it.future.done():
                    continue
                if isinstance(result, Exception):
                    it.future.set_exception(result)
                else:
                    self.scored += 1
                    it.future.set_result(float(result))
