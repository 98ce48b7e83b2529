"""The typed run config.

Every section is a small pydantic model with documented, bounded fields.
Unknown keys are errors (`extra="forbid"`), so a typo never silently falls back
to a default. The defaults are the embedded default run: the built-in tiny
model learning arithmetic with GRPO.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from temper.config.algo import AlgoConfig
from temper.config.critic import CriticConfig, check_critic
from temper.config.orchestrator import OrchestratorConfig
from temper.config.sampler import SamplerConfig
from temper.config.self_improve import RFTConfig, SFTConfig, check_self_improve
from temper.config.trainer import TrainerConfig
from temper.envs.base import EpisodeLimits
from temper.monitor.health import HealthConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(_Section):
    name: str = Field(
        "demo", min_length=1, description="Run name; the run directory is output_dir/name."
    )
    output_dir: str = Field("runs", description="Parent folder of run directories.")
    seed: int = Field(0, ge=0, description="Seeds sampling, data order and initialisation.")
    overwrite: bool = Field(
        False,
        description="Replace an existing run directory instead of refusing to start (only "
        "once the config, model, data and reward have been checked).",
    )
    resume: bool | Literal["auto"] = Field(
        False,
        description="Continue from the newest checkpoint in the run directory. true: fail "
        '(exit 2) when there is none; "auto": start fresh when there is none. A changed '
        "config is recorded as config.resumed_step_N.toml beside config.toml.",
    )
    threads: int = Field(0, ge=0, description="torch intra-op threads; 0 keeps torch's default.")


class ModelConfig(_Section):
    path: str = Field(
        "tiny", description='HF causal LM directory, or "tiny" for the built-in model.'
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Parameter dtype of the policy and the engine."
    )


class EngineConfig(_Section):
    type: Literal["native", "hf", "vllm", "openai"] = Field(
        "native",
        description='Which engine generates rollouts; "vllm" = vLLM in-process (pip install '
        '-e ".[vllm]"); "openai" = a remote OpenAI-compatible /v1/completions endpoint (eval '
        "and rollout-only runs).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the engine runs (native, hf, vllm): auto = CUDA when present."
    )
    sleep: bool = Field(
        False,
        description="vLLM on CUDA: free the engine's weights and KV cache while the trainer "
        "steps, and wake it after (colocated on one GPU).",
    )
    kv_cache_gb: float = Field(
        1.0, gt=0, description="vLLM on CPU: memory for its KV cache (VLLM_CPU_KVCACHE_SPACE)."
    )
    gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1, description="vLLM on CUDA: fraction of GPU memory it may take."
    )
    max_slots: int = Field(
        256, ge=1, description="Sequences decoded concurrently (native; vLLM's max_num_seqs)."
    )
    prefix_cache_mb: float = Field(
        256.0,
        ge=0,
        description="Native engine: memory for finished sequences' keys/values, reused by later "
        "prompts that start with the same tokens (the next turn of an episode); 0 = off.",
    )
    cpu_kernels: bool = Field(
        True,
        description="Native engine on CPU, float32: fuse decode attention into a C kernel "
        "compiled on first use (needs a C compiler; falls back to PyTorch ops without one).",
    )
    release_memory_during_train: bool = Field(
        True,
        description="Free the engine's KV cache while the trainer steps (engine and trainer "
        "share the machine).",
    )
    base_url: str | None = Field(
        None, description='Endpoint for type="openai", e.g. "http://127.0.0.1:8000/v1".'
    )
    api_key_env: str | None = Field(
        None, description='Environment variable holding the API key (type="openai").'
    )
    model_name: str | None = Field(
        None, description="Model id sent to the endpoint; default: the first it lists."
    )
    timeout_s: float = Field(
        120.0, gt=0, description='Per-request timeout in seconds (type="openai").'
    )

    @model_validator(mode="after")
    def _openai_needs_url(self) -> EngineConfig:
        if self.type == "openai" and not self.base_url:
            raise ValueError("engine.base_url is required when engine.type = 'openai'")
        if self.sleep and (self.type != "vllm" or self.device == "cpu"):
            raise ValueError("engine.sleep needs engine.type = 'vllm' on CUDA")
        return self


class DataConfig(_Section):
    type: Literal["arithmetic", "visual", "file"] = Field(
        "arithmetic",
        description="Built-in procedural arithmetic, built-in visual tasks (images), or a "
        "dataset file.",
    )
    levels: list[int] = Field(
        default_factory=lambda: [1, 2, 3], description="Arithmetic difficulty levels to draw from."
    )
    kinds: list[Literal["count", "number", "redder", "same_colour"]] = Field(
        default_factory=lambda: ["count", "number", "redder", "same_colour"],
        min_length=1,
        description="Visual task kinds to draw from (type=visual; see docs/vision.md).",
    )
    path: str | None = Field(None, description="Training file (.jsonl or .parquet) for type=file.")
    eval_path: str | None = Field(
        None, description="Held-out file for type=file; if unset, eval_size rows are split off."
    )
    prompt_field: str = Field("prompt", description="Column holding the prompt.")
    answer_field: str = Field("answer", description="Column holding the reference answer.")
    image_field: str = Field(
        "images",
        description="Column holding a row's images (one image or a list: bytes, path, data URL, "
        "or an HF datasets Image), shown in the prompt: at each '<image>' in its text, else "
        "before it. Rows without the column are text-only.",
    )
    id_field: str | None = Field(None, description="Column holding a stable row id.")
    category_field: str | None = Field(None, description="Column used for per-category metrics.")
    answer_extractor: Literal["gsm8k"] | None = Field(
        None, description='"gsm8k" takes the number after "####" as the answer.'
    )
    system_prompt: str | None = Field(None, description="Optional system message for every prompt.")
    eval_size: int = Field(200, ge=1, description="Held-out problems used by eval.")

    @model_validator(mode="after")
    def _file_needs_path(self) -> DataConfig:
        if self.type == "file" and not self.path:
            raise ValueError("data.path is required when data.type = 'file'")
        if any(lvl < 1 or lvl > 4 for lvl in self.levels) or not self.levels:
            raise ValueError("data.levels must be a non-empty list of levels in 1..4")
        return self


class EnvConfig(_Section):
    type: str = Field(
        "none",
        min_length=1,
        description='"none": single-turn prompts from `data`, scored by `reward`. Otherwise a '
        "multi-turn env: a built-in (tool_use, code, guess_number, wordle, arithmetic_chain, gym, visual_grid, miniwob) or "
        '"module:function" / "file.py:function" returning a temper.envs.registry.EnvSpec.',
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword options for the env's spec factory."
    )
    limits: EpisodeLimits = Field(
        default_factory=EpisodeLimits, description="Turn, wall-clock and token limits per episode."
    )
    add_reward: bool = Field(
        False,
        description="Also score the final assistant message with the `reward` section and add "
        "it to the env's reward.",
    )
    max_concurrency: int | None = Field(
        None, ge=1, description="Episodes in flight at once (default: all of a step's)."
    )

    @property
    def enabled(self) -> bool:
        return self.type != "none"


class RewardComponentConfig(_Section):
    # `schema` is an alias (pydantic reserves the name); the dump's `json_schema` also loads.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    type: Literal[
        "math",
        "format",
        "python",
        "overlong",
        "exact",
        "json_schema",
        "tool_call_ast",
        "reward_model",
        "judge",
    ] = Field(
        description="math: math-verify vs the answer; format: regex; python: your function; "
        "overlong: DAPO soft overlong penalty in [-1, 0]; exact: the completion (or its last "
        "\\boxed{}) equals the answer; json_schema: the completion (or its last ```json block) "
        "is JSON valid against a schema; tool_call_ast: the completion's tool calls match the "
        "task's expected calls (BFCL AST rules, temper.rewards.tool_call_ast); reward_model: a "
        "sequence-classification reward model in process (model) or a temper serve-rm URL "
        "(base_url); judge: an LLM judge behind any OpenAI-compatible endpoint (base_url, model)."
    )
    model: str | None = Field(
        None,
        description='For type=reward_model: a reward model directory or "tiny-rm" (in process); '
        "for type=judge: the model id sent to the endpoint.",
    )
    base_url: str | None = Field(
        None,
        description="For type=reward_model: a temper serve-rm URL; for type=judge: an "
        'OpenAI-compatible endpoint, e.g. "http://127.0.0.1:8000/v1".',
    )
    api_key_env: str | None = Field(
        None, description="For type=judge: environment variable holding the API key."
    )
    weight: float = Field(1.0, description="Weight of this component in the total reward.")
    pattern: str | None = Field(None, description="Regex for type=format.")
    function: str | None = Field(
        None,
        description='For type=python: "module:function" or "path/file.py:function" with TRL\'s '
        "signature (prompts, completions, **columns) -> list[float].",
    )
    max_tokens: int | None = Field(
        None,
        ge=1,
        description="For type=overlong: L_max; longer completions get -1. Lengths are "
        "whitespace-separated tokens unless build_reward is given a tokenizer.",
    )
    cache_tokens: int | None = Field(
        None,
        ge=1,
        description="For type=overlong: L_cache; the penalty ramps linearly from 0 at "
        "max_tokens - cache_tokens to -1 at max_tokens.",
    )
    json_schema: dict[str, Any] | None = Field(
        None,
        alias="schema",
        description="For type=json_schema: the JSON schema (key `schema`).",
    )
    schema_field: str | None = Field(
        None, description="For type=json_schema: the task column holding each task's schema."
    )
    ground_truth_field: str = Field(
        "ground_truth",
        description="For type=tool_call_ast: the task column holding the expected calls, BFCL "
        "format [{function: {arg: [allowed values]}}].",
    )
    functions_field: str = Field(
        "functions",
        description="For type=tool_call_ast: the task column holding the function schemas "
        "(BFCL or OpenAI format); optional per task, used for types and required args.",
    )

    @model_validator(mode="after")
    def _python_needs_function(self) -> RewardComponentConfig:
        if self.type == "python" and not self.function:
            raise ValueError("reward component of type 'python' needs 'function'")
        if self.type == "reward_model" and (self.model is None) == (self.base_url is None):
            raise ValueError(
                "reward component of type 'reward_model' needs exactly one of 'model' (in "
                "process) or 'base_url' (a temper serve-rm URL)"
            )
        if self.type == "judge" and not (self.base_url and self.model):
            raise ValueError("reward component of type 'judge' needs 'base_url' and 'model'")
        if self.type == "overlong":
            if self.max_tokens is None or self.cache_tokens is None:
                raise ValueError(
                    "reward component of type 'overlong' needs max_tokens and cache_tokens"
                )
            if self.cache_tokens > self.max_tokens:
                raise ValueError("overlong: cache_tokens must be <= max_tokens")
        if self.type == "json_schema" and (self.json_schema is None) == (self.schema_field is None):
            raise ValueError(
                "reward component of type 'json_schema' needs exactly one of schema or schema_field"
            )
        return self


class RewardConfig(_Section):
    components: list[RewardComponentConfig] = Field(
        default_factory=lambda: [RewardComponentConfig(type="math", weight=1.0)],
        description="Weighted components summed into the reward.",
    )
    on_error: Literal["zero", "drop"] = Field(
        "zero", description="A sample whose reward fails scores 0, or is dropped."
    )
    timeout_s: float = Field(5.0, gt=0, description="Per-item verification timeout.")
    workers: int = Field(1, ge=1, description="Reward worker processes.")
    filters: list[Literal["repetition", "gibberish"]] = Field(
        default_factory=lambda: ["repetition", "gibberish"],
        description="Reward-hacking filters: a flagged completion's total reward is zeroed "
        "(negative totals kept) and logged as component hack/<kind>. [] turns them off.",
    )
    repetition_ngram: int = Field(4, ge=1, description="repetition: n of the word n-grams.")
    repetition_threshold: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="repetition: flag when the share of repeated n-grams (1 - distinct/total) "
        "exceeds this (texts under 20 n-grams are never flagged).",
    )
    gibberish_threshold: float = Field(
        0.1,
        gt=0,
        lt=1,
        description="gibberish: flag when the share of non-printable/U+FFFD characters exceeds "
        "this (also flags 40+ visible characters with <= 3 distinct or one > half of them, "
        "or one word > half of 10+ words).",
    )


class EvalConfig(_Section):
    every: int = Field(40, ge=0, description="Evaluate every N steps (0 = only start and end).")
    at_start: bool = Field(True, description="Evaluate before the first step.")
    at_end: bool = Field(True, description="Evaluate after the last step.")
    size: int | None = Field(None, ge=1, description="Held-out tasks (default data.eval_size).")
    k: int = Field(4, ge=1, description="Samples per task for pass@k / mean@k.")
    temperature: float = Field(1.0, ge=0, description="Temperature of the sampled eval.")
    max_response_tokens: int | None = Field(
        None,
        ge=1,
        description="Response limit of eval samples (default: the suite's, else "
        "orchestrator.max_response_tokens).",
    )


class LogConfig(_Section):
    trajectories_per_step: int = Field(8, ge=0, description="Samples saved per step.")
    progress: bool = Field(
        True,
        description="Show progress on stderr: a live bar on a terminal, else one plain line per "
        "step (at most one per progress_every_s seconds when that is set).",
    )
    progress_every_s: float | None = Field(
        None,
        ge=0,
        description="Off a terminal: at most one progress line per this many seconds (the last "
        "step always prints); unset = every step, or TEMPER_PROGRESS_EVERY_S when that is set.",
    )
    sinks: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list,
        description="Metric sinks written next to metrics.jsonl (numeric scalars only). "
        "Each needs its extra: pip install temper-rl[tensorboard|wandb|mlflow].",
    )
    wandb_project: str = Field("temper", min_length=1, description="W&B project name.")
    wandb_entity: str | None = Field(None, description="W&B entity (team); None: your default.")
    wandb_mode: Literal["offline", "online", "disabled"] = Field(
        "offline",
        description='W&B mode. "offline" writes the run locally (upload later with wandb sync).',
    )
    mlflow_tracking_uri: str | None = Field(
        None, description="MLflow tracking URI; None: a file store at <run dir>/mlruns."
    )
    mlflow_experiment: str = Field("temper", min_length=1, description="MLflow experiment name.")
    profile_step: int | None = Field(
        None,
        ge=1,
        description="Record this training step with torch.profiler and write a Chrome trace "
        "to <run dir>/profile/step_N.trace.json (None: no profiling).",
    )


class CheckpointConfig(_Section):
    every: int = Field(0, ge=0, description="Checkpoint every N steps (0 = only at the end).")
    keep: int = Field(2, ge=1, description="Checkpoints kept on disk.")
    at_end: bool = Field(True, description="Checkpoint after the last step.")


class Config(_Section):
    """The whole run. `temper train` with no file uses these defaults."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    orchestrator: OrchestratorConfig = Field(default_factory=OrchestratorConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    rft: RFTConfig = Field(default_factory=RFTConfig)

    @model_validator(mode="after")
    def _modes_fit(self) -> Config:
        check_self_improve(self)
        check_critic(self)
        if self.algo.credit == "turn" and not self.env.enabled:
            raise ValueError(
                "algo.credit = 'turn' needs a multi-turn env (env.type); single-turn runs "
                "have one turn: use algo.credit = 'outcome'"
            )
        return self
