"""The `[engine]` config section: one config class per engine, chosen by ``type``.

Each engine takes only its own settings (an `hf` engine has no ``max_slots``, an
`openai` endpoint no ``device``), so a setting that does not apply is an
unknown key, not a silent no-op. ``type`` may be left out: the native engine.
The builder (`temper.builder.engines`) has one function per ``type``.

Each class also says what the loop should do with the engine while the
trainer steps (`during_train`), so no caller asks which engine it holds.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

#: What the loop does with a colocated engine while the trainer steps: nothing, free
#: its KV cache (`Engine.release_memory`), or free weights and cache (`Engine.sleep`).
DuringTrain = Literal["keep", "release", "sleep"]


class _EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    #: The engine runs the model in this process (so it can take the trainer's weights).
    local: ClassVar[bool] = True

    def during_train(self) -> DuringTrain:
        return "keep"

    def on_cuda(self) -> bool:
        """Whether the config pins the engine to CUDA."""
        return False


class _LocalEngineConfig(_EngineConfig):
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the engine runs: auto = CUDA when present."
    )

    def on_cuda(self) -> bool:
        return self.device == "cuda"


class NativeEngineConfig(_LocalEngineConfig):
    type: Literal["native"] = Field(
        "native", description="Temper's PyTorch engine: slot KV cache, continuous batching."
    )
    max_slots: int = Field(256, ge=1, description="Sequences decoded concurrently.")
    prefix_cache_mb: float = Field(
        256.0,
        ge=0,
        description="Memory for finished sequences' keys/values, reused by later prompts that "
        "start with the same tokens (the next turn of an episode); 0 = off.",
    )
    cpu_kernels: bool = Field(
        True,
        description="On CPU, float32: fuse decode attention into a C kernel compiled on first "
        "use (needs a C compiler; falls back to PyTorch ops without one).",
    )
    release_memory_during_train: bool = Field(
        True,
        description="Free the engine's KV cache while the trainer steps (engine and trainer "
        "share the machine).",
    )

    def during_train(self) -> DuringTrain:
        return "release" if self.release_memory_during_train else "keep"


class HFEngineConfig(_LocalEngineConfig):
    type: Literal["hf"] = Field(
        "hf", description="Hugging Face model.generate: the baseline, and any architecture."
    )


class VLLMEngineConfig(_LocalEngineConfig):
    type: Literal["vllm"] = Field(
        "vllm", description='vLLM in this process (pip install -e ".[vllm]"; docs/engines.md).'
    )
    max_slots: int = Field(256, ge=1, description="vLLM's max_num_seqs.")
    prefix_caching: bool = Field(True, description="vLLM's automatic prefix caching.")
    kv_cache_gb: float = Field(
        1.0, gt=0, description="On CPU: memory for the KV cache (VLLM_CPU_KVCACHE_SPACE)."
    )
    gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1, description="On CUDA: the fraction of GPU memory vLLM may take."
    )
    sleep: bool = Field(
        False,
        description="On CUDA: free the engine's weights and KV cache while the trainer "
        "steps, and wake it after (colocated on one GPU).",
    )

    @model_validator(mode="after")
    def _sleep_needs_cuda(self) -> VLLMEngineConfig:
        if self.sleep and self.device == "cpu":
            raise ValueError("engine.sleep needs vLLM on CUDA (engine.device = 'auto' or 'cuda')")
        return self

    def during_train(self) -> DuringTrain:
        return "sleep" if self.sleep else "keep"


class OpenAIEngineConfig(_EngineConfig):
    type: Literal["openai"] = Field(
        "openai",
        description="A remote OpenAI-compatible /v1/completions endpoint: eval and "
        "rollout-only runs (it takes no weight updates).",
    )
    base_url: str = Field(description='The endpoint, e.g. "http://127.0.0.1:8000/v1".')
    api_key_env: str | None = Field(None, description="Environment variable holding the API key.")
    model_name: str | None = Field(
        None, description="Model id sent to the endpoint; default: the first it lists."
    )
    timeout_s: float = Field(120.0, gt=0, description="Per-request timeout in seconds.")

    local: ClassVar[bool] = False


ENGINE_CONFIGS: dict[str, type[_EngineConfig]] = {
    "native": NativeEngineConfig,
    "hf": HFEngineConfig,
    "vllm": VLLMEngineConfig,
    "openai": OpenAIEngineConfig,
}


def _engine_type(value: Any) -> str:
    """The union's tag: ``type``, or "native" when the section leaves it out."""
    if isinstance(value, dict):
        return str(value.get("type", "native"))
    return value.type if isinstance(value, _EngineConfig) else "native"


EngineConfig = Annotated[
    Annotated[NativeEngineConfig, Tag("native")]
    | Annotated[HFEngineConfig, Tag("hf")]
    | Annotated[VLLMEngineConfig, Tag("vllm")]
    | Annotated[OpenAIEngineConfig, Tag("openai")],
    Discriminator(_engine_type),
]
