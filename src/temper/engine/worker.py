"""The compute side of the native engine: what its worker thread runs.

`NativeEngine` (the driver, on the event loop) plans a `Step`; `StepRunner.run`
executes it on the worker thread and returns a `StepResult`. One call runs the
cache compaction, then either one step that also prefills newly admitted
prompts, or up to ``Step.max_steps`` decode steps in a row. Running several
decode steps per call saves the event loop <-> thread hand-off (and its wake-ups)
on every token; the driver allows it only when no row can finish before the
last of those steps except by a stop token. The runner stops early, after the
current step, when a row samples one of its stop tokens or when the driver
signals an event (a new request, a cancellation, a weight update, close). So a
finished row is handled right after the step that finished it, as with one step
per call, and new requests wait at most one step to be admitted.

Each step holds the engine lock (so `update_weights` never lands mid-step) and
records the weight version it used. The per-row state (last token, position,
random-stream key and counter, sampling parameters, stop ids) lives here as
tensors, rebuilt from the driver's rows only when they change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from temper.engine.base import LogitsProcessor
from temper.engine.image_encoder import ImageEncoder
from temper.engine.kv_cache import SlotKVCache
from temper.engine.llama_forward import LlamaFamilyModel, Splice
from temper.engine.planning import group_by_length
from temper.engine.prefix_cache import PrefixCache
from temper.engine.requests import Request
from temper.engine.sampling import (
    RowParams,
    accept_tokens,
    sample,
    shaped_logits,
    top_alternatives,
    uniforms,
)
from temper.errors import TemperError

#: Padding (in tokens) worth one extra prefill forward; see `group_by_length`.
PREFILL_OVERHEAD_TOKENS = 32


@dataclass
class Step:
    """What the worker thread must do in one call (built by the driver)."""

    moves: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))
    move_len: int = 0
    decode_rows: int = 0
    decode_len: int = 0
    chunks: list[tuple[int, int, int]] = field(default_factory=list)
    rebuild: dict[str, list[Any]] | None = None
    prefill: list[Request] = field(default_factory=list)
    prefill_keys: list[int] = field(default_factory=list)
    #: Logits processors of each new sample (same order as ``prefill_keys``).
    prefill_processors: list[list[LogitsProcessor]] = field(default_factory=list)
    reset: bool = False
    #: Decode steps this call may run (1 when it prefills); stops earlier on a
    #: stop token or a driver event.
    max_steps: int = 1
    #: The driver's event counter when the step was planned.
    events: int = 0
    #: Cache positions to hold: the longest prompt + max_new_tokens in flight.
    reserve_len: int = 0
    #: Finished rows to copy into the prefix cache before the moves overwrite
    #: them: (row, positions, tokens of those positions, weight version).
    saves: list[tuple[int, int, np.ndarray, int]] = field(default_factory=list)


@dataclass
class StepResult:
    """Per-row tokens and raw logprobs of one call (``tokens[row][step]``).

    ``top[row][step]`` holds the row's top-logprob alternatives when some row
    asked for them (`SamplingParams.top_logprobs`), else ``top`` is None.
    """

    tokens: list[list[int]]
    logprobs: list[list[float]]
    versions: list[int]  # weight version of each step
    seconds: float
    top: list[list[dict[int, float]]] | None = None


@dataclass
class EngineStats:
    """Counters for metrics.

    ``prefill_tokens`` counts prompt tokens run through the model (once per
    prompt, not once per sample); ``prefix_reused_tokens`` the prompt tokens
    whose keys/values came from the prefix cache instead, in ``prefix_hits``
    prompts. ``prefill_batches`` counts steps that admitted
    new requests; ``prefill_forwards`` the forwards they took (one per group of
    similar-length prompts). ``compute_seconds`` is time spent in model steps.
    ``generated_tokens`` and ``decode_steps`` are counted as the steps run.
    """

    requests: int = 0
    samples: int = 0
    prefill_tokens: int = 0
    prefix_hits: int = 0
    prefix_reused_tokens: int = 0
    generated_tokens: int = 0
    decode_steps: int = 0
    prefill_batches: int = 0
    prefill_forwards: int = 0
    compute_seconds: float = 0.0


class StepRunner:
    """Runs `Step`s against the model and the slot cache (worker thread only).

    ``version`` reads the current weight version (call it under ``lock``);
    ``events`` reads the driver's event counter.
    """

    def __init__(
        self,
        model: LlamaFamilyModel,
        cache: SlotKVCache,
        lock: threading.Lock,
        stats: EngineStats,
        version: Callable[[], int],
        events: Callable[[], int],
        max_prefill_tokens: int,
        prefix: PrefixCache | None = None,
        encoder: ImageEncoder | None = None,
    ) -> None:
        self.model = model
        self.prefix = prefix
        self.encoder = encoder
        self.cache = cache
        self.lock = lock
        self.stats = stats
        self._version = version
        self._events = events
        self.max_prefill_tokens = max_prefill_tokens
        self._w: dict[str, Any] = {}

    def run(self, step: Step) -> StepResult:
        """Run ``step``; returns the tokens and logprobs of every row."""
        start = time.perf_counter()
        cache, w = self.cache, self._w
        b = step.decode_rows
        n_new = sum(r.params.n for r in step.prefill)
        self._top_rows, self._top_offset = b + n_new, 0
        longest = max(
            [step.decode_len + step.max_steps - 1] + [len(r.prompt) for r in step.prefill]
        )
        self._top: list[list[dict[int, float]]] | None = None
        with torch.inference_mode():
            with self.lock:
                if step.saves and self.prefix is not None:
                    self._save(step.saves)  # first: a reset or the moves overwrite the rows
                if step.reset:
                    cache.reset()
                    w.clear()
                src, dst = step.moves
                if src:
                    cache.move_rows(torch.tensor(src), torch.tensor(dst), step.move_len)
                cache.ensure(b + n_new, max(longest, step.reserve_len))
                if b and step.rebuild is not None:
                    self._load_rows(step.rebuild)
            if step.prefill:
                tokens, logprobs, version = self._first_step(step)
                self.stats.generated_tokens += tokens.shape[0]
                out_t, out_lp, versions = tokens.unsqueeze(1), logprobs.unsqueeze(1), [version]
            else:
                out_t, out_lp, versions = self._decode_steps(step)
        seconds = time.perf_counter() - start
        self.stats.compute_seconds += seconds
        return StepResult(out_t.tolist(), out_lp.tolist(), versions, seconds, self._top)

    def _first_step(self, step: Step) -> tuple[torch.Tensor, torch.Tensor, int]:
        """One decode step over the running rows plus the prefill of the new prompts."""
        w, b = self._w, step.decode_rows
        with self.lock:
            version = self._version()
            toks, lps = [], []
            if b:
                if step.rebuild is None:
                    self._advance(b)
                tok, lp = self._decode_one(step.decode_len, step.chunks)
                toks.append(tok)
                lps.append(lp)
                self.stats.decode_steps += 1
            self._top_offset = b
            tok, lp = self._prefill(step, b)
            toks.append(tok)
            lps.append(lp)
            tokens = toks[0] if len(toks) == 1 else torch.cat(toks)
            w["last"] = tokens
        return tokens, lps[0] if len(lps) == 1 else torch.cat(lps), version

    def _decode_steps(self, step: Step) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Up to ``step.max_steps`` decode steps; stops after a stop token or an event."""
        w, b = self._w, step.decode_rows
        out_t = torch.empty(b, step.max_steps, dtype=torch.int64)
        out_lp = torch.empty(b, step.max_steps, dtype=torch.float32)
        versions: list[int] = []
        stop = w.get("stop")
        for j in range(step.max_steps):
            with self.lock:
                versions.append(self._version())
                if j or step.rebuild is None:
                    self._advance(b)
                chunks = [(r0, r1, t + j) for r0, r1, t in step.chunks]
                tok, lp = self._decode_one(step.decode_len + j, chunks)
            w["last"] = tok
            out_t[:, j] = tok
            out_lp[:, j] = lp
            self.stats.decode_steps += 1
            self.stats.generated_tokens += b
            if stop is not None and bool((stop == tok.unsqueeze(1)).any()):
                break
            if self._events() != step.events:
                break
        n = len(versions)
        return out_t[:, :n], out_lp[:, :n], versions

    def _advance(self, b: int) -> None:
        w = self._w
        w["tok"] = w["last"][:b]
        w["pos"] += 1
        w["ctr"] += 1

    def _decode_one(
        self, length: int, chunks: list[tuple[int, int, int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        w = self._w
        logits = self.model.decode(w["tok"], w["pos"], self.cache, length, chunks)
        params: RowParams = w["params"]
        u = None if params.all_greedy else torch.from_numpy(uniforms(w["key"], w["ctr"]))
        return self._sample(logits, params, u, w["procs"], w["top"])

    def _sample(
        self,
        logits: torch.Tensor,
        params: RowParams,
        u: torch.Tensor | None,
        procs: list[list[LogitsProcessor]],
        top: list[int],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`sample` plus the optional extras: logits processors (penalties,
        grammars) and top-logprob alternatives, collected into ``self._top``."""
        shaped = shaped_logits(logits, procs)
        if shaped is None and not any(top):
            return sample(logits, params, u)  # the default path: no extra work
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens, chosen = sample(logits, params, u, shaped, logprobs)
        accept_tokens(procs, tokens)
        if any(top):
            alts = top_alternatives(logprobs, top)
            if self._top is None:
                self._top = [[] for _ in range(self._top_rows)]
            for row, alt in enumerate(alts):
                self._top[self._top_offset + row].append(alt)
        return tokens, chosen

    def _load_rows(self, rebuild: dict[str, list[Any]]) -> None:
        w = self._w
        w["tok"] = torch.tensor(rebuild["tok"], dtype=torch.int64)
        w["pos"] = torch.tensor(rebuild["pos"], dtype=torch.int64)
        w["key"] = np.array(rebuild["key"], dtype=np.uint64)
        w["ctr"] = np.array(rebuild["ctr"], dtype=np.uint64)
        ps = rebuild["params"]
        w["params"] = RowParams.build(
            [p.temperature for p in ps], [p.top_k for p in ps], [p.top_p for p in ps]
        )
        # Empty lists when no row uses them: the default path then tests one empty list.
        procs, top = rebuild["procs"], [p.top_logprobs for p in ps]
        w["procs"] = procs if any(procs) else []
        w["top"] = top if any(top) else []
        stops: list[frozenset[int]] = rebuild["stop"]
        width = max(len(s) for s in stops)
        if width:
            table = torch.full((len(stops), width), -1, dtype=torch.int64)
            for row, ids in enumerate(stops):
                if ids:
                    table[row, : len(ids)] = torch.tensor(sorted(ids), dtype=torch.int64)
            w["stop"] = table
        else:
            w.pop("stop", None)

    def _save(self, saves: list[tuple[int, int, np.ndarray, int]]) -> None:
        """Copy finished rows into the prefix cache (only those of the current weights)."""
        assert self.prefix is not None
        version = self._version()
        for row, length, tokens, row_version in saves:
            if row_version == version and length <= self.cache.position_capacity:
                self.prefix.add(tokens, *self.cache.read_row(row, length))

    def _prefill(self, step: Step, first_row: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill ``requests`` into rows from ``first_row``; sample each sample's first token.

        A prompt that shares a prefix with a prefix-cache entry gets those
        keys/values copied in and runs only the rest (`_extend`). The others are
        grouped by length (`group_by_length`) so padding stays small; each group
        is one forward whose keys/values go to the rows of all the group's samples.
        """
        requests, keys = step.prefill, step.prefill_keys
        offsets, total = [], 0
        for r in requests:
            offsets.append(total)
            total += r.params.n
        model = self.model
        logits = torch.empty(total, model.vocab_size, dtype=torch.float32)
        hits: dict[int, int] = {}
        if self.encoder is not None:  # every new image of the step in one vision forward
            self.encoder.features([im for r in requests for im in r.images])
        if self.prefix is not None:
            for k, r in enumerate(requests):
                assert r.key is not None
                found = self.prefix.lookup(r.key)
                if found is not None:
                    entry, shared = found
                    rows = torch.arange(r.params.n) + first_row + offsets[k]
                    self.cache.write_rows(rows, entry.k[:, :, :shared], entry.v[:, :, :shared])
                    hits[k] = shared
            if hits:
                self._extend(requests, hits, offsets, first_row, logits)
        # Identical prompts admitted together (a group's episodes, each its own request)
        # run once; their keys/values go to the rows of every sample of each.
        prompts: dict[bytes, list[int]] = {}
        for k, r in enumerate(requests):
            if k not in hits:
                assert r.key is not None
                prompts.setdefault(r.key.tobytes(), []).append(k)
        members = list(prompts.values())
        lengths = [len(requests[ks[0]].prompt) for ks in members]
        self.stats.prefill_tokens += sum(lengths)
        for group in group_by_length(lengths, PREFILL_OVERHEAD_TOKENS, self.max_prefill_tokens):
            width = max(lengths[u] for u in group)
            ids = torch.zeros(len(group), width, dtype=torch.int64)
            for i, u in enumerate(group):
                ids[i, : lengths[u]] = torch.tensor(requests[members[u][0]].prompt)
            src = [
                i
                for i, u in enumerate(group)
                for k in members[u]
                for _ in range(requests[k].params.n)
            ]
            out_rows = [
                offsets[k] + j
                for u in group
                for k in members[u]
                for j in range(requests[k].params.n)
            ]
            src_t = torch.tensor(src, dtype=torch.int64)
            rows_t = torch.tensor(out_rows, dtype=torch.int64)
            lens_t = torch.tensor([lengths[u] for u in group], dtype=torch.int64)
            shared = len(src) > len(group)  # some prompt fills more than one row
            embeds = [
                e for i, u in enumerate(group) for e in self._splices(requests[members[u][0]], i, 0)
            ]
            out = model.prefill(
                ids, lens_t, self.cache, rows_t + first_row, src_t if shared else None, embeds
            )
            logits[rows_t] = out.index_select(0, src_t) if shared else out
            self.stats.prefill_forwards += 1
        params = [r.params for r in requests for _ in range(r.params.n)]
        row_params = RowParams.build(
            [p.temperature for p in params], [p.top_k for p in params], [p.top_p for p in params]
        )
        u = None
        if not row_params.all_greedy:
            key_arr = np.array(keys, dtype=np.uint64)
            u = torch.from_numpy(uniforms(key_arr, np.zeros(len(keys), dtype=np.uint64)))
        top = [p.top_logprobs for p in params]
        return self._sample(logits, row_params, u, step.prefill_processors, top)

    def _extend(
        self,
        requests: list[Request],
        hits: dict[int, int],
        offsets: list[int],
        first_row: int,
        logits: torch.Tensor,
    ) -> None:
        """Run the uncached rest of each hit prompt (``hits``: index -> cached length)."""
        order = list(hits)
        rest = [len(requests[k].prompt) - hits[k] for k in order]
        self.stats.prefix_hits += len(order)
        self.stats.prefix_reused_tokens += sum(hits.values())
        self.stats.prefill_tokens += sum(rest)
        for sub in group_by_length(rest, PREFILL_OVERHEAD_TOKENS, self.max_prefill_tokens):
            group = [order[i] for i in sub]
            width = max(rest[i] for i in sub)
            ids = torch.zeros(len(group), width, dtype=torch.int64)
            rows = []
            embeds: list[Splice] = []
            for i, k in enumerate(group):
                suffix = requests[k].prompt[hits[k] :]
                ids[i, : len(suffix)] = torch.tensor(suffix, dtype=torch.int64)
                rows.append(torch.arange(requests[k].params.n) + first_row + offsets[k])
                embeds.extend(self._splices(requests[k], i, hits[k]))
            starts = torch.tensor([hits[k] for k in group], dtype=torch.int64)
            lens = torch.tensor([rest[i] for i in sub], dtype=torch.int64)
            out = self.model.extend(ids, starts, lens, self.cache, rows, embeds)
            for i, row_ids in enumerate(rows):
                logits[row_ids - first_row] = out[i]
            self.stats.prefill_forwards += 1

    def _splices(self, request: Request, row: int, start: int) -> list[Splice]:
        """The image features of ``request`` at prompt positions ``start`` and later, as
        splices into batch row ``row`` of a forward that begins at ``start``."""
        if not request.spans:
            return []
        assert self.encoder is not None  # the engine refuses images without one
        out: list[Splice] = []
        features = self.encoder.features(request.images)
        for (begin, length), rows in zip(request.spans, features, strict=True):
            if rows.shape[0] != length:
                raise TemperError(
                    f"an image has {length} tokens in the prompt, but the vision tower "
                    f"gives {rows.shape[0]} features for it"
                )
            first = max(begin, start)
            if first < begin + length:
                out.append((row, first - start, rows[first - begin :]))
        return out
