"""The native PyTorch engine: slot KV cache, continuous batching, shared prefill.

How it runs. `NativeEngine.generate` validates the prompt, queues a request
and awaits its future. One driver task on the caller's event loop runs the
scheduler: between model steps it admits waiting requests (in submission
order, while free slots remain; a request whose n samples do not fit waits,
and so does everything behind it), then hands one step to a single dedicated
worker thread (`run_in_executor`), so the event loop stays responsive while the
model computes. A step is: compact the cache over finished rows, one batched
decode forward over all running sequences, then a (batched, right-padded)
prefill of the newly admitted prompts. Each prompt is prefilled once and its
keys/values are written into the n rows of its n samples. Finished samples free
their rows right after the step that finished them.

Requests started together (e.g. by `asyncio.gather`) are queued before the
driver next runs, so they are admitted in the same step. Sampling uses
per-sample counter-based random streams (`temper.engine.sampling`), so a seeded
request gives the same tokens whatever else is in the batch (up to float
rounding differences between batch shapes, which can flip a token in rare
near-ties).

`update_weights` copies weights in place under a lock that every step holds,
so a step never sees half-updated weights. Sequences in flight keep the
keys/values computed with the old weights; each token records the version
that sampled it. What this engine does not do: prefix caching across requests,
chunked prefill, speculative decoding, sliding-window attention (see
`temper.engine.llama_forward` for the model limits).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from temper.engine.base import GenerationResult, SamplingParams
from temper.engine.llama_forward import LlamaFamilyModel, attention_chunks
from temper.engine.requests import (
    Request,
    Sequence,
    StopChecker,
    eos_token_ids,
    validate_prompt,
)
from temper.engine.sampling import RowParams, sample, stream_key, uniforms
from temper.errors import ModelLoadError, TemperError

#: Padding (in tokens) worth one extra prefill forward; see `group_by_length`.
PREFILL_OVERHEAD_TOKENS = 32


@dataclass
class EngineStats:
    """Counters for metrics.

    ``prefill_tokens`` counts prompt tokens run through the model (once per
    prompt, not once per sample). ``prefill_batches`` counts steps that admitted
    new requests; ``prefill_forwards`` the forwards they took (one per group of
    similar-length prompts). ``compute_seconds`` is time spent in model steps.
    """

    requests: int = 0
    samples: int = 0
    prefill_tokens: int = 0
    generated_tokens: int = 0
    decode_steps: int = 0
    prefill_batches: int = 0
    prefill_forwards: int = 0
    compute_seconds: float = 0.0


@dataclass
class _Step:
    """What the worker thread must do in one step (built by the driver)."""

    moves: tuple[list[int], list[int]] = ((), ())  # type: ignore[assignment]
    move_len: int = 0
    decode_rows: int = 0
    decode_len: int = 0
    chunks: list[tuple[int, int, int]] = field(default_factory=list)
    rebuild: dict[str, list[Any]] | None = None
    prefill: list[Request] = field(default_factory=list)
    prefill_keys: list[int] = field(default_factory=list)
    reset: bool = False


class NativeEngine:
    """Native engine for Llama-family HF models (Llama, Mistral, Qwen2, Qwen3).

    ``model`` is an in-memory HF causal LM; its weights are copied (cast to
    ``dtype`` if given). ``tokenizer`` is needed only for stop strings.
    ``max_slots`` bounds the sequences decoded at once; ``max_context`` defaults
    to the model's ``max_position_embeddings``. ``max_prefill_tokens`` bounds the
    padded size of one prefill forward (larger admissions are split). ``seed``
    seeds the shared generator used by unseeded requests.
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
        seed: int | None = None,
    ) -> None:
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        if max_slots < 1:
            raise ValueError(f"max_slots must be >= 1, got {max_slots}")
        self._model = LlamaFamilyModel(model, dtype=dtype, max_context=max_context)  # type: ignore[arg-type]
        self.max_context: int = self._model.max_context
        self.max_slots = max_slots
        self.max_prefill_tokens = max_prefill_tokens
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids(model)
        self.version: int = 0
        self.stats = EngineStats()
        self._stop = StopChecker(tokenizer, self.max_context)
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="temper-native")
        self._rng = torch.Generator()
        self._rng.manual_seed(seed if seed is not None else int(torch.seed()))
        self._cache = self._model.new_cache(max_slots)
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
        self._needs_reset = False
        self._closed = False
        # Worker-side per-row state (touched only on the worker thread).
        self._w: dict[str, Any] = {}

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: torch.dtype | str | None = None,
        load_tokenizer: bool = True,
        **opts: Any,
    ) -> NativeEngine:
        """Load an HF model (and its tokenizer, if present) from ``path``."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        try:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"cannot load model from {path}: {e}") from e
        tokenizer = None
        if load_tokenizer:
            with contextlib.suppress(OSError, ValueError):
                tokenizer = AutoTokenizer.from_pretrained(str(path))
        return cls(model.eval(), tokenizer, dtype=dtype, **opts)

    # ------------------------------------------------------------------ public API
    async def generate(
        self, prompt_token_ids: Seq[int], params: SamplingParams
    ) -> GenerationResult:
        """Generate ``params.n`` samples continuing ``prompt_token_ids``.

        Raises `PromptTooLongError` when the prompt leaves no room to generate,
        and `TemperError` for other unusable input (empty prompt, ids outside
        the vocabulary, n above ``max_slots``, stop strings without tokenizer).
        """
        if self._closed:
            raise RuntimeError("NativeEngine is closed")
        prompt = validate_prompt(prompt_token_ids, self.max_context, self._model.vocab_size)
        if params.n > self.max_slots:
            raise TemperError(f"SamplingParams.n={params.n} exceeds max_slots={self.max_slots}")
        if params.stop_strings and self.tokenizer is None:
            raise TemperError("stop_strings need a tokenizer; pass one to NativeEngine")
        loop = self._ensure_driver()
        stop_ids = frozenset(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        request = Request(prompt, params, loop.create_future(), stop_ids)
        self._waiting.append(request)
        assert self._wake is not None
        self._wake.set()
        try:
            return await request.future
        except asyncio.CancelledError:
            request.future.cancel()  # marks the request aborted; its rows are freed
            raise

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy ``state_dict`` (HF names, a subset is fine) into the engine as ``version``.

        Blocks until the current step ends; tokens sampled afterwards record
        ``version``.
        """
        with self._lock:
            self._model.load_state_dict(state_dict)
            self.version = int(version)

    async def close(self) -> None:
        """Fail waiting and running requests, stop the driver and the worker thread."""
        self._closed = True
        if self._wake is not None:
            self._wake.set()
        driver = self._driver
        if driver is not None and not driver.done() and self._loop is asyncio.get_running_loop():
            with contextlib.suppress(asyncio.CancelledError):
                await driver
        self._fail_all(RuntimeError("NativeEngine was closed"))
        self._executor.shutdown(wait=True)
        self._cache.release()

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
        self._needs_reset = True
        self._loop = loop
        self._wake = asyncio.Event()
        self._driver = loop.create_task(self._drive(), name="temper-native-driver")
        return loop

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
                out = await loop.run_in_executor(self._executor, self._compute, step)
                self._absorb(admitted, *out)
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

    def _plan(self, admitted: list[Request]) -> _Step:
        rows = self._rows
        step = _Step(moves=self._pending_moves, move_len=self._move_len, prefill=admitted)
        step.reset, self._needs_reset = self._needs_reset, False
        step.decode_rows = len(rows)
        if rows:
            lengths = [s.length for s in rows]
            if self._dirty:
                self._chunks = attention_chunks(lengths, self._model.chunk_overhead())
            step.chunks = [(r0, r1, max(lengths[r0:r1])) for r0, r1 in self._chunks]
            step.decode_len = max(t for _, _, t in step.chunks)
        if self._dirty and rows:
            step.rebuild = {
                "tok": [s.tokens[-1] for s in rows],
                "pos": [s.length - 1 for s in rows],
                "key": [s.key for s in rows],
                "ctr": [len(s.tokens) for s in rows],
                "params": [s.request.params for s in rows],
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
            self.stats.prefill_tokens += len(req.prompt)
            for i in range(req.params.n):
                seed = req.params.seed
                if seed is None:
                    key = int(torch.randint(0, 2**62, (1,), generator=self._rng))
                else:
                    key = stream_key(seed, i)
                rows.append(Sequence(req, i, key, len(req.prompt)))
                step.prefill_keys.append(key)
        return step

    def _absorb(
        self,
        admitted: list[Request],
        tokens: list[int],
        logprobs: list[float],
        version: int,
        seconds: float,
    ) -> None:
        """Append the step's tokens, finish sequences, and plan compaction."""
        self.stats.compute_seconds += seconds
        self.stats.generated_tokens += len(tokens)
        if len(tokens) > sum(r.params.n for r in admitted):
            self.stats.decode_steps += 1
        finished: list[int] = []
        check = self._stop.check
        for row, (seq, tok, lp) in enumerate(zip(self._rows, tokens, logprobs, strict=True)):
            seq.tokens.append(tok)
            seq.logprobs.append(lp)
            seq.versions.append(version)
            seq.length += 1
            req = seq.request
            if req.aborted:
                finished.append(row)
                continue
            done = check(seq, tok)
            if done is not None:
                req.finish(seq, *done)
                finished.append(row)
        if finished:
            self._compact(finished)

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
        self._dirty = True
        self._needs_reset = True

    # ------------------------------------------------------------------ worker
    def _compute(self, step: _Step) -> tuple[list[int], list[float], int, float]:
        """Run one step on the worker thread; returns tokens and logprobs per row."""
        start = time.perf_counter()
        with torch.inference_mode(), self._lock:
            version = self.version
            cache, w = self._cache, self._w
            if step.reset:
                cache.reset()
                w.clear()
            src, dst = step.moves
            if src:
                cache.move_rows(torch.tensor(src), torch.tensor(dst), step.move_len)
            b = step.decode_rows
            n_new = sum(r.params.n for r in step.prefill)
            longest = max([step.decode_len] + [len(r.prompt) for r in step.prefill])
            cache.ensure(b + n_new, longest)
            toks, lps = [], []
            if b:
                if step.rebuild is not None:
                    self._load_rows(step.rebuild)
                else:
                    w["tok"] = w["last"][:b]
                    w["pos"] += 1
                    w["ctr"] += 1
                logits = self._model.decode(w["tok"], w["pos"], cache, step.decode_len, step.chunks)
                u = (
                    None
                    if w["params"].all_greedy
                    else torch.from_numpy(uniforms(w["key"], w["ctr"]))
                )
                tok, lp = sample(logits, w["params"], u)
                toks.append(tok)
                lps.append(lp)
            if step.prefill:
                tok, lp = self._prefill(step.prefill, step.prefill_keys, b)
                toks.append(tok)
                lps.append(lp)
            tokens = toks[0] if len(toks) == 1 else torch.cat(toks)
            w["last"] = tokens
        logprobs = (lps[0] if len(lps) == 1 else torch.cat(lps)).tolist()
        return tokens.tolist(), logprobs, version, time.perf_counter() - start

    def _load_rows(self, rebuild: dict[str, list[Any]]) -> None:
        w = self._w
        w["tok"] = torch.tensor(rebuild["tok"], dtype=torch.int64)
        w["pos"] = torch.tensor(rebuild["pos"], dtype=torch.int64)
        w["key"] = np.array(rebuild["key"], dtype=np.uint64)
        w["ctr"] = np.array(rebuild["ctr"], dtype=np.uint64)
        ps: list[SamplingParams] = rebuild["params"]
        w["params"] = RowParams.build(
            [p.temperature for p in ps], [p.top_k for p in ps], [p.top_p for p in ps]
        )

    def _prefill(
        self, requests: list[Request], keys: list[int], first_row: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill ``requests`` into rows from ``first_row``; sample each sample's first token.

        Prompts are grouped by length (`group_by_length`) so padding stays small;
        each group is one forward whose keys/values go to the rows of all the
        group's samples.
        """
        offsets, total = [], 0
        for r in requests:
            offsets.append(total)
            total += r.params.n
        logits = torch.empty(total, self._model.vocab_size, dtype=torch.float32)
        lengths = [len(r.prompt) for r in requests]
        for group in group_by_length(lengths, PREFILL_OVERHEAD_TOKENS, self.max_prefill_tokens):
            width = max(lengths[k] for k in group)
            ids = torch.zeros(len(group), width, dtype=torch.int64)
            for i, k in enumerate(group):
                ids[i, : lengths[k]] = torch.tensor(requests[k].prompt, dtype=torch.int64)
            src = [i for i, k in enumerate(group) for _ in range(requests[k].params.n)]
            out_rows = [offsets[k] + j for k in group for j in range(requests[k].params.n)]
            src_t = torch.tensor(src, dtype=torch.int64)
            rows_t = torch.tensor(out_rows, dtype=torch.int64)
            lens_t = torch.tensor([lengths[k] for k in group], dtype=torch.int64)
            out = self._model.prefill(ids, lens_t, self._cache, rows_t + first_row, src_t)
            logits[rows_t] = out.index_select(0, src_t)
            self.stats.prefill_forwards += 1
        params = [r.params for r in requests for _ in range(r.params.n)]
        row_params = RowParams.build(
            [p.temperature for p in params], [p.top_k for p in params], [p.top_p for p in params]
        )
        u = None
        if not row_params.all_greedy:
            key_arr = np.array(keys, dtype=np.uint64)
            u = torch.from_numpy(uniforms(key_arr, np.zeros(len(keys), dtype=np.uint64)))
        return sample(logits, row_params, u)


def group_by_length(lengths: list[int], overhead: int, budget: int) -> list[list[int]]:
    """Split prompt indices into prefill groups of similar length.

    Sorts the prompts by length and picks the contiguous split that minimises
    ``padded tokens + overhead * groups`` (``overhead`` is the rough cost of one
    more forward, in tokens), with each group's padded size at most ``budget``
    tokens (a longer prompt gets a group of its own). Dynamic programming over
    the sorted lengths, O(len(lengths) * group size).
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    sizes = [lengths[k] for k in order]
    n = len(sizes)
    best = [0] + [0] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        width = sizes[j - 1]
        best[j], cut[j] = best[j - 1] + overhead + width, j - 1
        i = j - 2
        while i >= 0 and width * (j - i) <= budget:
            cost = best[i] + overhead + width * (j - i)
            if cost < best[j]:
                best[j], cut[j] = cost, i
            i -= 1
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]
