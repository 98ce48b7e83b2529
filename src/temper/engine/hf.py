"""The baseline engine: Hugging Face ``model.generate`` behind the Engine protocol.

Each `generate` call runs one ``model.generate`` over its n samples (the prompt
repeated n times; one prompt, so no padding) on the compute thread (`temper.compute`);
concurrent calls queue and run one after another, with no batching across
requests. Logprobs are the raw ``log_softmax`` of the model logits
(``output_logits``), before temperature and filters. Stops follow the same
rules as the native engine (`temper.engine.requests.StopChecker`): the output
is cut right after the first stop token or stop string, and the stop token is
kept.

Penalties and logits processors (`SamplingParams.shapes_logits`) run as one HF
``LogitsProcessor`` over the per-sample processors of `temper.engine.sampling`;
top-logprob alternatives come from the same raw logits as the logprobs.

Seeding uses ``torch.manual_seed(seed)`` before the call, i.e. the global torch
RNG: a seeded request is reproducible, but its samples depend on n and are not
the same stream as the native engine's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from typing import Any

import torch

from temper import compute
from temper.engine.base import (
    EngineAbilities,
    EngineDefaults,
    GenerationResult,
    SampleOutput,
    SamplingParams,
    TokenScores,
)
from temper.engine.requests import StopChecker, eos_token_ids, validate_prompt, validate_scored
from temper.engine.sampling import row_processors, token_scores, top_alternatives
from temper.errors import TemperError
from temper.vision.images import Image
from temper.vision.processor import VisionProcessor
from temper.weights.adapter import AdapterBase, is_adapter_update
from temper.weights.transport import WeightTransport


class HFEngine(EngineDefaults):
    """Wraps an in-memory HF causal LM's ``generate``; ``tokenizer`` is needed
    only for stop strings. ``max_context`` defaults to the model's
    ``max_position_embeddings``."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any | None = None,
        *,
        max_context: int | None = None,
        vision: VisionProcessor | None = None,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.vision = vision
        self.abilities = EngineAbilities(images=vision is not None, scoring=vision is None)
        text_config = model.config.get_text_config()
        limit = int(getattr(text_config, "max_position_embeddings", 0) or 2048)
        self.max_context: int = min(limit, max_context) if max_context else limit
        self.version: int = 0
        self.eos_token_ids = eos_token_ids(model)
        self.vocab_size = int(text_config.vocab_size)
        self._stop = StopChecker(tokenizer, self.max_context)
        self._lock = threading.Lock()
        #: The base weights LoRA adapter updates merge into (`temper.weights.adapter`).
        self._adapters = AdapterBase()
        self._closed = False

    async def generate(
        self, prompt_token_ids: Seq[int], params: SamplingParams, images: Seq[Image] = ()
    ) -> GenerationResult:
        """Generate ``params.n`` samples with one ``model.generate`` call."""
        if self._closed:
            raise RuntimeError("HFEngine is closed")
        prompt = validate_prompt(prompt_token_ids, self.max_context, self.vocab_size)
        if params.stop_strings and self.tokenizer is None:
            raise TemperError("stop_strings need a tokenizer; pass one to HFEngine")
        if images and self.vision is None:
            raise TemperError("this HFEngine's model takes no images (it has no image processor)")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            compute.executor(), self._generate, prompt, params, list(images)
        )

    async def score(self, token_ids: Seq[int], top_logprobs: int = 0) -> TokenScores:
        """Logprobs of given ids (`Engine.score`): one forward of the HF model."""
        ids = validate_scored(token_ids, self.max_context, self.vocab_size)

        def forward() -> TokenScores:
            with self._lock, torch.no_grad():
                x = torch.tensor(ids, device=self.model.device)
                logits = self.model(input_ids=x.view(1, -1)).logits[0]
                return TokenScores(*token_scores(logits, x, top_logprobs))

        return await compute.arun(forward)

    def load_weights(self, transport: WeightTransport, version: int) -> None:
        """Receive ``version``; ``load_state_dict(strict=False)`` on the compute thread.
        A LoRA adapter update (`temper.weights.adapter`) is merged first."""
        state_dict, got = transport.receive(version)
        compute.run(self._load_weights, state_dict, got)

    def _load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        with self._lock, torch.no_grad():
            if is_adapter_update(state_dict):  # merged: W = W0 + B @ A from a kept W0
                state_dict = self._adapters.merged(state_dict, self._read)
            else:
                self._adapters.forget(state_dict)
            result = self.model.load_state_dict(dict(state_dict), strict=False)
            if result.unexpected_keys:
                raise KeyError(
                    f"load_weights: unknown parameter name(s) {result.unexpected_keys[:5]}"
                )
            self.version = int(version)

    def _read(self, name: str) -> torch.Tensor:
        """A copy of the model's weight ``name`` (the base an adapter merges into)."""
        try:
            return self.model.get_parameter(name).detach().clone()
        except AttributeError:
            raise KeyError(f"load_weights: unknown parameter name {name!r}") from None

    async def close(self) -> None:
        """Refuse new calls; a running call finishes on the compute thread."""
        self._closed = True

    # ------------------------------------------------------------------ worker
    def _generate(
        self, prompt: list[int], params: SamplingParams, images: list[Image]
    ) -> GenerationResult:
        from transformers import GenerationConfig

        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        max_new = min(params.max_new_tokens, self.max_context - len(prompt))
        config = GenerationConfig(
            do_sample=not params.greedy,
            temperature=params.temperature if not params.greedy else 1.0,
            top_k=params.top_k,
            top_p=params.top_p,
            max_new_tokens=max_new,
            # An id outside the vocabulary never matches: no stop token at all.
            eos_token_id=sorted(stop_ids) or [self.vocab_size],
            pad_token_id=getattr(self.model.config, "pad_token_id", None) or 0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        extra: dict[str, Any] = {}
        if params.stop_strings:
            extra["stopping_criteria"] = self._stop_string_criteria(
                len(prompt), params.stop_strings
            )
        if params.shapes_logits:
            extra["logits_processor"] = _shaping_processor(len(prompt), params)
        ids = torch.tensor([prompt] * params.n, dtype=torch.long)
        if images and self.vision is not None:
            pixels = self.vision.pixel_inputs(images)  # the prompt's images, once per sample
            extra.update({k: torch.cat([v] * params.n) for k, v in pixels.items()})
        with self._lock, torch.inference_mode():
            version = self.version
            if params.seed is not None:
                torch.manual_seed(params.seed)
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                generation_config=config,
                **extra,
            )
        new = out.sequences[:, len(prompt) :]
        # One step at a time: stacking [n, steps, vocab] would be large for big vocabularies.
        logprobs = torch.stack(
            [
                torch.log_softmax(step.float(), dim=-1).gather(1, new[:, t : t + 1]).squeeze(1)
                for t, step in enumerate(out.logits)
            ],
            dim=1,
        )
        samples = [
            self._finish(prompt, new[i].tolist(), logprobs[i].tolist(), params, stop_ids, version)
            for i in range(params.n)
        ]
        if params.top_logprobs:
            wanted = [params.top_logprobs] * params.n
            steps = [top_alternatives(torch.log_softmax(s.float(), -1), wanted) for s in out.logits]
            for i, sample in enumerate(samples):
                sample.top_logprobs = [steps[t][i] for t in range(len(sample.token_ids))]
        return GenerationResult(list(prompt), samples)

    def _stop_string_criteria(self, prompt_len: int, stop_strings: tuple[str, ...]) -> Any:
        """A StoppingCriteria ending rows whose generated tail holds a stop string."""
        from transformers import StoppingCriteria, StoppingCriteriaList

        checker = self._stop

        class _StopStrings(StoppingCriteria):
            def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
                rows = input_ids[:, prompt_len:].tolist()
                done = [checker.stop_string(r, stop_strings) is not None for r in rows]
                return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

        return StoppingCriteriaList([_StopStrings()])

    def _finish(
        self,
        prompt: list[int],
        tokens: list[int],
        logprobs: list[float],
        params: SamplingParams,
        stop_ids: set[int],
        version: int,
    ) -> SampleOutput:
        """Cut a raw HF row at the first stop and name its finish reason."""
        n, finish, stop = self._stop.cut(len(prompt), tokens, params, stop_ids)
        return SampleOutput(tokens[:n], logprobs[:n], finish, [version] * n, stop)


def _shaping_processor(prompt_len: int, params: SamplingParams) -> Any:
    """An HF logits processor running each row's penalties and processors: it
    first reports the row's newest token to them, then lets them edit the row."""
    from transformers import LogitsProcessor, LogitsProcessorList

    rows = [row_processors(params) for _ in range(params.n)]

    class _Shaping(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            scores = scores.float().clone()
            fed = input_ids.shape[1] > prompt_len
            for i, procs in enumerate(rows):
                for proc in procs:
                    if fed:
                        proc.accept(int(input_ids[i, -1]))
                    proc.apply(scores[i])
            return scores

    return LogitsProcessorList([_Shaping()])
