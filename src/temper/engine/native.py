"""The native PyTorch engine: slot KV cache, continuous batching, shared prefill.

How it runs. `NativeEngine.generate` validates the prompt, queues a request
and awaits its future. One driver task on the caller's event loop runs the
scheduler: between model steps it admits waiting requests (in submission
order, while free slots remain; a request whose n samples do not fit waits,
and so does everything behind it), then hands work to a single dedicated
worker thread, the process's compute thread (`temper.compute`;
`temper.engine.worker`), so the event loop stays responsive while the model
computes. A step is: compact the cache over
finished rows, one batched decode forward over all running sequences, then the
prefill of the newly admitted prompts (grouped by length into a few
right-padded forwards, see `temper.engine.planning`). Each prompt is prefilled
once and its keys/values are written into the n rows of its n samples (and
into the rows of any other request admitted with the identical prompt, such as
the episodes of one group). When
nothing was admitted, one hand-off runs many decode steps in a row: as many as
no row can finish in by length, ending early after a step that samples a stop
token, or once a new request, a cancellation, a weight update or `close`
arrives. Finished samples free their rows right after the step that finished
them, and a new request waits at most one step.

Requests started together (e.g. by `asyncio.gather`) are queued before the
driver next runs, so they are admitted in the same step. Sampling uses
per-sample counter-based random streams (`temper.engine.sampling`), so a seeded
request gives the same tokens whatever else is in the batch (up to float
rounding differences between batch shapes, which can flip a token in rare
near-ties).

`update_weights` copies weights in place under a lock that every step holds,
so a step never sees half-updated weights. Sequences in flight keep the
keys/values computed with the old weights; each token records the version
that sampled it. The engine is used from one event loop at a time; a new loop
(e.g. a second `asyncio.run`) starts it afresh. Prefix caching: a finished
sequence's keys/values are kept (`temper.engine.prefix_cache`, a byte budget,
cleared at each weight update), and a later prompt that starts with the same
tokens, such as the next turn of a conversation, runs only its new part. What
this engine does not do: chunked prefill, speculative decoding,
sliding-window attention (see `temper.engine.llama_forward` for the model
limits). Memory: the weights are copied once, and the KV cache grows to
(rows in use) x (longest sequence) x layers x 2 x kv_heads x head_dim values.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import secrets
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import numpy as np
import torch

from temper import compute
from temper.engine.base import (
    EngineAbilities,
    EngineDefaults,
    GenerationResult,
    SamplingParams,
    TokenScores,
    TokenUpdate,
)
from temper.engine.image_encoder import (
    ImageEncoder,
    is_vlm,
    request_images,
    split_vlm_state_dict,
    text_model_of,
)
from temper.engine.llama_forward import LlamaFamilyModel
from temper.engine.planning import attention_chunks
from temper.engine.prefix_cache import PrefixCache
from temper.engine.requests import (
    Request,
    Sequence,
    StopChecker,
    eos_token_ids,
    validate_prompt,
    validate_scored,
)
from temper.engine.sampling import row_processors, stream_key, token_scores
from temper.engine.worker import EngineStats, Step, StepResult, StepRunner
from temper.errors import ModelLoadError, TemperError
from temper.vision.images import Image
from temper.vision.processor import VisionProcessor
from temper.weights.adapter import AdapterBase, is_adapter_update
from temper.weights.transport import WeightTransport

__all__ = ["EngineStats", "NativeEngine"]


def trim_heap() -> None:
    """Return freed malloc memory to the OS (glibc only; a no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


#: Most decode steps the worker runs per hand-off (bounds the latency of events).
MAX_STEPS_PER_CALL = 64


class NativeEngine(EngineDefaults):
    """Native engine for Llama-family HF models (Llama, Mistral, Qwen2, Qwen3).

    ``model`` is an in-memory HF causal LM; its weights are copied (cast to
    ``dtype`` if given). ``tokenizer`` is needed only for stop strings.
    ``max_slots`` bounds the sequences decoded at once; ``max_context`` defaults
    to the model's ``max_position_embeddings``. ``max_prefill_tokens`` bounds the
    padded size of one prefill forward (larger admissions are split).
    ``prefix_cache_mb`` bounds the prefix cache (0 turns it off). ``seed`` seeds
    the shared generator used by unseeded requests. ``cpu_kernels`` allows the
    fused C decode-attention kernel (`temper.engine.cpu_kernels`) for float32 on
    CPU; without it, or where it cannot be built, decode runs in PyTorch ops.

    A LLaVA-style vision-language ``model`` needs ``vision``, its processor: the
    engine then takes images (`temper.engine.image_encoder`), encodes each
    distinct image once per weight version, and splices its features into the
    prefill; the prefix cache and shared prefill match prompts by ids *and*
    images.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any | None = None,
        *,
        max_slots: int = 256,
        max_context: int | None = None,
        dtype: torch.dtype | str | None = None,
        max_prefill_tokens: int = 4096,
        prefix_cache_mb: float = 256.0,
        seed: int | None = None,
        cpu_kernels: bool = True,
        vision: VisionProcessor | None = None,
    ) -> None:
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        if max_slots < 1:
            raise ValueError(f"max_slots must be >= 1, got {max_slots}")
        self._encoder: ImageEncoder | None = None
        text_model = model
        if is_vlm(model):
            if vision is None:
                raise ModelLoadError(
                    f"{type(model).__name__} is a vision-language model: pass its processor "
                    "(vision=VisionProcessor.from_pretrained(path))"
                )
            text_model = text_model_of(model)
        # Weight copies run on the compute thread, like every op on them (see `temper.compute`).
        self._model = compute.run(
            LlamaFamilyModel,  # type: ignore[arg-type]
            text_model,
            dtype=dtype,
            max_context=max_context,
            cpu_kernels=cpu_kernels,
        )
        if vision is not None and is_vlm(model):
            self._encoder = compute.run(
                ImageEncoder,  # type: ignore[arg-type]
                model,
                vision,
                self._model.dtype,
                self._model.device,
            )
        text_only = self._encoder is None  # scoring takes no images
        self.abilities = EngineAbilities(
            weight_updates=True, release_memory=True, stream=True, images=not text_only,
            scoring=text_only,
        )  # fmt: skip
        self.max_context: int = self._model.max_context
        self.max_slots = max_slots
        self.max_prefill_tokens = max_prefill_tokens
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids(model)
        self.version: int = 0
        self.stats = EngineStats()
        self._stop = StopChecker(tokenizer, self.max_context)
        self._lock = threading.Lock()
        self._adapters = AdapterBase()  # the base W0 that LoRA adapter updates merge into
        self._rng = torch.Generator()
        self._rng.manual_seed(seed if seed is not None else secrets.randbits(63))
        self._cache = compute.run(self._model.new_cache, max_slots)
        # Driver-side state (touched only on the event loop thread).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._driver: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._waiting: deque[Request] = deque()
        self._rows: list[Sequence] = []
        self._pending_moves: tuple[list[int], list[int]] = ([], [])
        self._move_len = 0
        self._dirty = True
        self._chunks: list[tuple[int, int]] = []
        self._reserve_len = 0
        self._needs_reset = False
        self._pending_saves: list[tuple[int, int, np.ndarray, int]] = []
        self._closed = False
        # Bumped (on the loop thread) by anything the worker should return for:
        # a new request, a cancellation, a weight update, close.
        self._events = 0
        self._runner = StepRunner(
            self._model,
            self._cache,
            self._lock,
            self.stats,
            version=lambda: self.version,
            events=lambda: self._events,
            max_prefill_tokens=max_prefill_tokens,
            prefix=PrefixCache(int(prefix_cache_mb * 2**20)) if prefix_cache_mb > 0 else None,
            encoder=self._encoder,
        )

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: torch.dtype | str | None = None,
        load_tokenizer: bool = True,
        **opts: Any,
    ) -> NativeEngine:
        """Load an HF model (and its tokenizer and image processor, if present) from ``path``."""
        from transformers import AutoTokenizer

        from temper.models import load_model, resolve_model_path

        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        path = resolve_model_path(path)  # "tiny", "tiny_vlm": the shipped models
        model = compute.run(load_model, str(path), dtype=dtype or torch.float32)
        tokenizer = None
        if load_tokenizer:
            with contextlib.suppress(OSError, ValueError):
                tokenizer = AutoTokenizer.from_pretrained(str(path))
        if is_vlm(model):
            opts.setdefault("vision", VisionProcessor.from_pretrained(path))
        return cls(model.eval(), tokenizer, dtype=dtype, **opts)

    # ------------------------------------------------------------------ public API
    async def generate(
        self,
        prompt_token_ids: Seq[int],
        params: SamplingParams,
        images: Seq[Image] = (),
        *,
        listener: Callable[[TokenUpdate], None] | None = None,
    ) -> GenerationResult:
        """Generate ``params.n`` samples continuing ``prompt_token_ids``.

        ``images`` are the prompt's images in order (a VLM only); their token
        runs are already in the ids. Raises `PromptTooLongError` when the prompt
        leaves no room to generate, and `TemperError` for other unusable input
        (empty prompt, ids outside the vocabulary, n above ``max_slots``, stop
        strings without tokenizer, images that do not match the image tokens).
        ``listener`` (see `generate_stream`) gets each step's new tokens.
        """
        if self._closed:
            raise RuntimeError("NativeEngine is closed")
        prompt = validate_prompt(prompt_token_ids, self.max_context, self._model.vocab_size)
        if params.n > self.max_slots:
            raise TemperError(f"SamplingParams.n={params.n} exceeds max_slots={self.max_slots}")
        if params.stop_strings and self.tokenizer is None:
            raise TemperError("stop_strings need a tokenizer; pass one to NativeEngine")
        shown = request_images(self._encoder, prompt, list(images))
        loop = self._ensure_driver()
        stop_ids = frozenset(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        request = Request(
            prompt, params, loop.create_future(), stop_ids, listener=listener, **shown
        )
        self._waiting.append(request)
        self._events += 1
        assert self._wake is not None
        self._wake.set()
        try:
            return await request.future
        except asyncio.CancelledError:
            request.future.cancel()  # marks the request aborted; its rows are freed
            self._events += 1
            raise

    async def generate_stream(
        self, prompt_token_ids: Seq[int], params: SamplingParams
    ) -> AsyncIterator[TokenUpdate]:
        """`generate`, yielding each sample's new tokens after every engine call
        (one or more decode steps), then the result; see `StreamingEngine`."""
        queue: asyncio.Queue[TokenUpdate | None] = asyncio.Queue()
        task = asyncio.ensure_future(
            self.generate(prompt_token_ids, params, listener=queue.put_nowait)
        )
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (update := await queue.get()) is not None:
                yield update
            yield TokenUpdate(result=await task)
        finally:
            task.cancel()

    async def score(self, token_ids: Seq[int], top_logprobs: int = 0) -> TokenScores:
        """Logprobs of given ids (`Engine.score`): one cache-free forward on the compute
        thread, under the weights lock, so it never sees half an update."""
        ids = validate_scored(token_ids, self.max_context, self._model.vocab_size)

        def forward() -> TokenScores:
            with self._lock, torch.inference_mode():
                x = torch.tensor(ids, device=self._model.device)
                return TokenScores(*token_scores(self._model.all_logits(x), x, top_logprobs))

        return await compute.arun(forward)

    def load_weights(self, transport: WeightTransport, version: int) -> None:
        """Receive ``version`` (HF names, a subset is fine) and copy it into the engine.

        A LoRA adapter update (`temper.weights.adapter`) is merged into the engine's
        weights, ``W = W0 + B @ A`` from a kept copy of the base W0. Blocks until the
        current step ends; tokens sampled afterwards record ``version``.
        """
        state_dict, got = transport.receive(version)
        self._events += 1  # the worker returns after its current step
        compute.run(self._load_weights, state_dict, got)

    def _load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        with self._lock:
            text, vision = dict(state_dict), {}
            if self._encoder is not None:
                text, vision = split_vlm_state_dict(state_dict)
                self._encoder.check_state_dict(vision)  # before any copy: all or nothing
            if is_adapter_update(state_dict):
                if vision:
                    raise ValueError(
                        f"adapter update: {next(iter(vision))} is on the image side, which "
                        "takes full weights only"
                    )
                # Merged into the engine's own weights, so decoding costs what it did
                # before (a LoRA-aware forward measured slower: docs/algorithms.md).
                text = self._adapters.merged(text, self._model.read)
            else:
                self._adapters.forget(text)
            self._model.load_state_dict(text)
            if vision:  # new image-side weights: the cached features go too
                assert self._encoder is not None
                self._encoder.load_state_dict(vision)
            self.version = int(version)
            if self._runner.prefix is not None:
                self._runner.prefix.clear()  # its keys/values came from the old weights

    def release_memory(self) -> bool:
        """Free the KV cache and hand freed heap back to the OS, if the engine is idle.

        For colocated runs: the orchestrator calls it before the trainer steps so
        training does not stack its activations on top of the engine's cache.
        Returns False (and frees nothing) while requests are waiting or running;
        the cache grows again on the next request.
        """
        if self._rows or self._waiting:
            return False

        self._pending_saves = []

        def release() -> None:
            with self._lock:
                self._runner.cache.release()
                if self._runner.prefix is not None:
                    self._runner.prefix.clear()
                self._needs_reset = True
            trim_heap()

        compute.run(release)
        return True

    async def close(self) -> None:
        """Fail waiting and running requests, stop the driver and the worker thread."""
        self._closed = True
        self._events += 1
        if self._wake is not None:
            self._wake.set()
        driver = self._driver
        if driver is not None and not driver.done() and self._loop is asyncio.get_running_loop():
            with contextlib.suppress(asyncio.CancelledError):
                await driver
        self._fail_all(RuntimeError("NativeEngine was closed"))
        compute.run(self._free_caches)

    def _free_caches(self) -> None:
        self._cache.release()
        if self._runner.prefix is not None:
            self._runner.prefix.clear()

    def stats_dict(self) -> dict[str, float]:
        """The counters in `stats` as a flat dict (for metric sinks)."""
        return dict(self.stats.__dict__)

    # ------------------------------------------------------------------ driver
    def _ensure_driver(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._driver is not None and not self._driver.done():
            if self._loop is loop:
                return loop
            if self._loop is not None and self._loop.is_running():
                raise RuntimeError("NativeEngine is already driven by another running event loop")
        # First use, or the previous loop is gone: start clean on this loop.
        self._waiting.clear()
        self._rows = []
        self._pending_moves, self._move_len = ([], []), 0
        self._dirty = True
        self._needs_reset = True  # pending saves still run: no step touched their rows
        self._loop = loop
        self._wake = asyncio.Event()
        self._driver = loop.create_task(self._drive(), name="temper-native-driver")
        self._driver.add_done_callback(self._driver_done)
        return loop

    def _driver_done(self, task: asyncio.Task[None]) -> None:
        """A driver that died of a bug fails its requests instead of leaving them hanging."""
        if not task.cancelled() and task.exception() is not None:
            self._fail_all(task.exception())  # type: ignore[arg-type]

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        while True:
            await asyncio.sleep(0)  # let requests started in the same tick enqueue
            if self._closed:
                return
            admitted = self._admit()
            if not self._rows and not admitted:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                step = self._plan(admitted)
                out = await loop.run_in_executor(compute.executor(), self._runner.run, step)
                self._absorb(out)
            except asyncio.CancelledError:
                self._needs_reset = True
                raise
            except Exception as exc:  # a failed step fails its requests, not the engine
                for req in admitted:
                    if not req.future.done():
                        req.future.set_exception(exc)
                self._fail_all(exc)

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        free = self.max_slots - len(self._rows)
        while self._waiting:
            req = self._waiting[0]
            if req.aborted:
                self._waiting.popleft()
                continue
            if req.params.n > free:
                break
            self._waiting.popleft()
            free -= req.params.n
            admitted.append(req)
        return admitted

    def _plan(self, admitted: list[Request]) -> Step:
        rows = self._rows
        step = Step(moves=self._pending_moves, move_len=self._move_len, prefill=admitted)
        step.reset, self._needs_reset = self._needs_reset, False
        step.saves, self._pending_saves = self._pending_saves, []
        step.decode_rows = len(rows)
        step.events = self._events
        if admitted:
            longest = max(len(r.prompt) + r.params.max_new_tokens for r in admitted)
            self._reserve_len = min(self.max_context, max(self._reserve_len, longest))
        elif not rows:
            self._reserve_len = 0
        step.reserve_len = self._reserve_len
        if rows:
            lengths = [s.length for s in rows]
            if self._dirty:
                self._chunks = attention_chunks(lengths, self._model.chunk_overhead())
            step.chunks = [(r0, r1, max(lengths[r0:r1])) for r0, r1 in self._chunks]
            step.decode_len = max(t for _, _, t in step.chunks)
            if not admitted:
                step.max_steps = self._steps_ahead()
        if self._dirty and rows:
            step.rebuild = {
                "tok": [s.tokens[-1] for s in rows],
                "pos": [s.length - 1 for s in rows],
                "key": [s.key for s in rows],
                "ctr": [len(s.tokens) for s in rows],
                "params": [s.request.params for s in rows],
                "procs": [s.processors for s in rows],
                "stop": [s.request.stop_ids for s in rows],
            }
        self._pending_moves, self._move_len, self._dirty = ([], []), 0, bool(admitted)
        if admitted:
            self.stats.prefill_batches += 1
            # Rows of one admission sorted by prompt length keep decode attention
            # chunks (`attention_chunks`) tight.
            admitted.sort(key=lambda r: len(r.prompt))
        for req in admitted:
            self.stats.requests += 1
            self.stats.samples += req.params.n
            for i in range(req.params.n):
                seed = req.params.seed
                if seed is None:
                    key = int(torch.randint(0, 2**62, (1,), generator=self._rng))
                else:
                    key = stream_key(seed, i)
                seq = Sequence(req, i, key, len(req.prompt), processors=row_processors(req.params))
                rows.append(seq)
                step.prefill_keys.append(key)
                step.prefill_processors.append(seq.processors)
        return step

    def _steps_ahead(self) -> int:
        """Decode steps the worker may run in one call: no row can finish earlier
        except by a stop token (which the worker watches for itself)."""
        steps = MAX_STEPS_PER_CALL
        for seq in self._rows:
            params = seq.request.params
            if params.stop_strings:
                return 1  # stop strings are checked here, after every step
            left = min(params.max_new_tokens - len(seq.tokens), self.max_context - seq.length)
            steps = min(steps, left)
        return max(1, steps)

    def _absorb(self, out: StepResult) -> None:
        """Append the call's tokens, finish sequences, and plan compaction.

        Only the last step of a call can finish a row (`_steps_ahead`, and the
        worker stops on stop tokens), so only the newest token is checked.
        """
        finished: list[int] = []
        check = self._stop.check
        versions, steps = out.versions, len(out.versions)
        rows = zip(self._rows, out.tokens, out.logprobs, strict=True)
        for row, (seq, toks, lps) in enumerate(rows):
            seq.tokens.extend(toks)
            seq.logprobs.extend(lps)
            top = None
            if out.top is not None and seq.request.params.top_logprobs:
                top = out.top[row]
                seq.top.extend(top)
            if seq.request.listener is not None and not seq.request.aborted:
                seq.request.listener(TokenUpdate(seq.index, list(toks), list(lps), top))
            seq.versions.extend(versions)
            seq.length += steps
            req = seq.request
            if req.aborted:
                finished.append(row)
                continue
            done = check(seq, toks[-1])
            if done is not None:
                req.finish(seq, *done)
                finished.append(row)
                self._keep_prefix(row, seq)
        if finished:
            self._compact(finished)

    def _keep_prefix(self, row: int, seq: Sequence) -> None:
        """Have the next step copy ``row`` into the prefix cache, if one weight version made it."""
        if self._runner.prefix is None or len(set(seq.versions)) != 1:
            return
        assert seq.request.key is not None
        tokens = np.concatenate([seq.request.key, np.asarray(seq.tokens[:-1], dtype=np.int64)])
        self._pending_saves.append((row, seq.length - 1, tokens, seq.versions[0]))

    def _compact(self, finished: list[int]) -> None:
        """Free ``finished`` rows by moving the last live rows into the holes."""
        rows = self._rows
        keep = len(rows) - len(finished)
        gone = set(finished)
        holes = [r for r in finished if r < keep]
        sources = [r for r in range(keep, len(rows)) if r not in gone]
        length = max((rows[r].length for r in sources), default=0)
        for src, dst in zip(sources, holes, strict=True):
            rows[dst] = rows[src]
        del rows[keep:]
        self._pending_moves, self._move_len = (sources, holes), length
        self._dirty = True

    def _fail_all(self, exc: BaseException) -> None:
        for seq in self._rows:
            if not seq.request.future.done():
                seq.request.future.set_exception(exc)
        for req in self._waiting:
            if not req.future.done():
                req.future.set_exception(exc)
        self._waiting.clear()
        self._rows = []
        self._pending_moves, self._move_len = ([], []), 0
        self._pending_saves = []
        self._dirty = True
        self._needs_reset = True
