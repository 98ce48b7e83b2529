"""The Engine protocol: token ids in, token ids + logprobs out.

Every engine (native, hf, later vllm/sglang) implements `Engine`. Callers never
send text: they send the exact prompt token ids and get back the exact sampled
ids with the engine's per-token logprobs (the behaviour logprobs) and the
policy version that produced each token.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from temper.engine.structured import StructuredOutput
from temper.errors import ConfigError
from temper.weights.transport import WeightTransport

if TYPE_CHECKING:
    import torch

    from temper.vision.images import Image

FinishReason = Literal["stop", "length", "abort"]


class LogitsProcessor(Protocol):
    """A per-sample rule that edits the next-token logits before sampling.

    The engine makes one instance per sample (from the factories in
    `SamplingParams.logits_processors`), calls `apply` on that sample's float32
    logits row ``[vocab]`` before each draw (edit it in place, e.g. set
    forbidden tokens to -inf), then `accept` with the token it drew. Both run on
    the engine's compute thread. The reported logprobs stay those of the raw
    logits: a processor changes what is sampled, not what the policy says.
    """

    def apply(self, logits: torch.Tensor) -> None: ...

    def accept(self, token_id: int) -> None: ...


#: Builds a fresh `LogitsProcessor` for one sample.
LogitsProcessorFactory = Callable[[], LogitsProcessor]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. Greedy decoding is `temperature=0`.

    `seed` makes sampling reproducible: sample i of a request draws from its own
    random stream seeded by (seed, i), so the result does not depend on which
    other requests share the batch. `top_k=0` and `top_p=1.0` disable those
    filters. `ignore_eos` keeps generating past the model's end-of-sequence token
    (benchmarks use it to generate a fixed number of tokens).

    Optional, off by default and free when off:

    - `top_logprobs=k` also returns, per generated token, the k most likely
      tokens and their raw logprobs (`SampleOutput.top_logprobs`).
    - `presence_penalty` / `frequency_penalty` (OpenAI semantics) lower the
      logit of every token already generated in this sample by
      ``presence + frequency * count``; the prompt does not count.
    - `logits_processors`: factories of per-sample `LogitsProcessor`s (e.g. a
      grammar mask), applied after the penalties.
    - `structured`: a declared output shape (`temper.engine.structured`), taken
      only by an engine with `EngineAbilities.structured_outputs`; for other
      engines the caller turns it into `logits_processors`.

    Penalties and processors shape sampling only: `SampleOutput.logprobs` and
    `top_logprobs` stay the raw policy logprobs.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    top_logprobs: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logits_processors: tuple[LogitsProcessorFactory, ...] = ()
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        values = vars(self)
        for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
            if not math.isfinite(values[name]):
                raise ValueError(f"SamplingParams.{name} must be finite, got {values[name]}")
        if self.top_logprobs < 0:
            raise ValueError(f"SamplingParams.top_logprobs must be >= 0, got {self.top_logprobs}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(
                f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}"
            )
        # Accept lists from callers but store tuples so params stay hashable.
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        object.__setattr__(self, "logits_processors", tuple(self.logits_processors))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def shapes_logits(self) -> bool:
        """Whether penalties or processors edit the logits before sampling."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logits_processors)


@dataclass
class SampleOutput:
    """One generated continuation.

    `token_ids` are exactly the sampled ids, including a stop token when one
    ended the sample (so the trainer trains on it). `logprobs[i]` is the
    engine's log-probability of `token_ids[i]` under the sampling distribution
    before temperature/top-k/top-p (i.e. the raw policy logprob).
    `policy_versions[i]` is the weight version that produced token i.
    `stop_reason` is the stop token id or stop string that ended the sample.
    `retokenized` is True when the ids are not the sampled ones but the
    re-encoding of returned text (an endpoint that does not return token ids);
    such samples are fine to score, not to train on.
    `top_logprobs[i]` (only when `SamplingParams.top_logprobs` > 0) maps the
    most likely token ids at position i to their raw logprobs.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    policy_versions: list[int] = field(default_factory=list)
    stop_reason: int | str | None = None
    retokenized: bool = False
    top_logprobs: list[dict[int, float]] | None = None


@dataclass
class GenerationResult:
    """The n samples for one prompt."""

    prompt_token_ids: list[int]
    samples: list[SampleOutput]


@dataclass
class TokenUpdate:
    """What `StreamingEngine.generate_stream` yields: the tokens sample `sample`
    drew since its last update (with their raw logprobs and, when asked, top
    alternatives), or, last of all, the whole `result` (then the other fields
    are empty)."""

    sample: int = 0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] | None = None
    result: GenerationResult | None = None


@dataclass(frozen=True)
class EngineAbilities:
    """What an engine can do beyond `generate` and `close`.

    Callers read these flags and call the matching method; they never probe an
    engine with `getattr`. Every engine has every method (`EngineDefaults`
    supplies the no-op ones), so a flag says whether a call *does* something:

    - `weight_updates`: `load_weights` loads new weights (False for a remote
      endpoint, whose weights are not ours).
    - `release_memory`: `release_memory()` can free the KV cache between steps
      (colocated runs: the trainer's activations do not stack on top of it).
    - `sleep`: `sleep()` frees weights and KV cache until `wake_up()` (vLLM on a
      GPU shared with the trainer).
    - `metrics`: `metrics()` reports per-step counters worth logging.
    - `stream`: the engine is a `StreamingEngine`: `generate_stream` yields
      tokens as they are sampled.
    - `images`: `generate` takes the prompt's images (a vision-language model
      with its processor); without it, a prompt with images is refused.
    - `structured_outputs`: the engine enforces `SamplingParams.structured`
      itself (vLLM's structured outputs); without it, callers send the
      constraint as `logits_processors` instead.
    - `scoring`: `score` returns the logprobs of given tokens (``echo``
      completions in `temper serve`; a distillation teacher behind it).
    """

    weight_updates: bool = True
    release_memory: bool = False
    sleep: bool = False
    metrics: bool = False
    stream: bool = False
    images: bool = False
    structured_outputs: bool = False
    scoring: bool = False


@dataclass
class TokenScores:
    """What `Engine.score` returns for ids ``x_0 .. x_{L-1}``: ``logprobs[i]`` is
    log p(x_{i+1} | x_0..x_i) under the current weights (L - 1 values; the first
    token has none), raw (no temperature), with the ``top_logprobs`` most likely ids
    at each of those positions when asked for."""

    logprobs: list[float]
    top_logprobs: list[dict[int, float]] | None = None


@runtime_checkable
class Engine(Protocol):
    """A text-generation engine over token ids.

    Implementations: `temper.engine.native.NativeEngine` (KV cache, continuous
    batching, shared prefill), `temper.engine.hf.HFEngine` (wraps
    `model.generate`, the baseline), `temper.engine.vllm_engine.VLLMEngine`
    (vLLM in-process) and `temper.engine.openai_endpoint.OpenAIEndpointEngine`.

    Weights only arrive through a `temper.weights.WeightTransport`: the trainer
    publishes a version, the engine's `load_weights` receives it.
    """

    #: What the optional methods below actually do for this engine.
    abilities: EngineAbilities
    #: Weight version currently loaded. Starts at 0.
    version: int
    #: Longest prompt + generation the engine accepts, in tokens.
    max_context: int

    async def generate(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, images: Sequence[Image] = ()
    ) -> GenerationResult:
        """Generate `params.n` samples continuing `prompt_token_ids`.

        ``images`` (`temper.vision.Image`, only with `abilities.images`) are the
        prompt's images in order; their token runs are already in the ids
        (`temper.vision.processor.VisionProcessor.expand`). Raises
        `temper.errors.PromptTooLongError` if the prompt does not fit.
        """
        ...

    def load_weights(self, transport: WeightTransport, version: int) -> None:
        """Receive `version` from `transport` (HF names; a subset is fine) and serve it.

        Requests in flight finish their current step on the old weights; tokens
        sampled afterwards record `version`.
        """
        ...

    def release_memory(self) -> bool:
        """Free the KV cache if idle; True if something was freed."""
        ...

    def sleep(self) -> None:
        """Free weights and KV cache until `wake_up` (only with `abilities.sleep`)."""
        ...

    def wake_up(self) -> None:
        """Undo `sleep`: weights and cache back in place."""
        ...

    def metrics(self) -> dict[str, float]:
        """Counters to log with the step (empty without `abilities.metrics`)."""
        ...

    async def score(self, token_ids: Sequence[int], top_logprobs: int = 0) -> TokenScores:
        """The logprob of each of ``token_ids`` after the first, given the ones before
        it (only with `abilities.scoring`)."""
        ...

    async def close(self) -> None:
        """Stop background work and free memory."""
        ...


class StreamingEngine(Engine, Protocol):
    """An engine with `abilities.stream`: it can report tokens as they are sampled."""

    def generate_stream(
        self, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenUpdate]:
        """`generate`, yielding each sample's new tokens after every engine step and
        then the `GenerationResult` (the same one `generate` returns). Closing the
        iterator early cancels the request."""
        ...


class EngineDefaults:
    """The optional methods of `Engine` for engines whose abilities leave them out."""

    abilities = EngineAbilities()

    def load_weights(self, transport: WeightTransport, version: int) -> None:
        raise ConfigError(f"{type(self).__name__} cannot take weight updates")

    def release_memory(self) -> bool:
        return False

    def sleep(self) -> None:
        raise ConfigError(f"{type(self).__name__} cannot sleep")

    def wake_up(self) -> None:
        raise ConfigError(f"{type(self).__name__} cannot sleep")

    def metrics(self) -> dict[str, float]:
        return {}

    async def score(self, token_ids: Sequence[int], top_logprobs: int = 0) -> TokenScores:
        raise ConfigError(f"{type(self).__name__} cannot score given tokens")
