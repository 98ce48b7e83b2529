"""The typed run config.

Every section is a small pydantic model with documented, bounded fields.
Unknown keys are errors (`extra="forbid"`), so a typo never silently falls back
to a default. The defaults are the embedded default run: the built-in tiny
model learning arithmetic with GRPO.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from temper.config.agent import AgentConfig
from temper.config.algo import AlgoConfig
from temper.config.critic import CriticConfig, check_critic
from temper.config.distill import DistillConfig, check_distill
from temper.config.dpo import DPOConfig, check_dpo
from temper.config.engine import EngineConfig, NativeEngineConfig
from temper.config.env import EnvConfig
from temper.config.health import HealthConfig
from temper.config.lora import LoraConfig, check_lora
from temper.config.orchestrator import OrchestratorConfig
from temper.config.reward import RewardConfig
from temper.config.sampler import SamplerConfig
from temper.config.self_improve import RFTConfig, SFTConfig, check_self_improve
from temper.config.trainer import TrainerConfig


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
    chat_template: str = Field(
        "auto",
        description='How prompts are rendered: "auto" (the tokenizer\'s template; an error '
        'when it has none), "raw" (plain text, for base models), "chatml", or a path to a '
        ".jinja file (README: Base models).",
    )


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
    every: int = Field(0, ge=0, description="Checkpoint every N steps (0 = by time only).")
    # On by default: a run killed mid-way (SIGKILL, OOM, a lost node) has something
    # to resume from without anyone having chosen a step cadence.
    every_minutes: float = Field(
        10.0,
        ge=0,
        description="Also checkpoint after a step once this many minutes have passed since "
        "the last checkpoint (or the start); 0 = off.",
    )
    keep: int = Field(2, ge=1, description="Latest checkpoints kept on disk.")
    keep_best: bool = Field(
        True,
        description="Checkpoint a mid-run eval step whose held-out accuracy is the best so far "
        "(the final eval's step when at_end wrote one), and keep it beyond keep "
        "(checkpoints/best.json names it).",
    )
    at_end: bool = Field(True, description="Checkpoint after the last step.")


class Config(_Section):
    """The whole run. `temper train` with no file uses these defaults."""

    run: RunConfig = Field(default_factory=RunConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=NativeEngineConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    orchestrator: OrchestratorConfig = Field(default_factory=OrchestratorConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    rft: RFTConfig = Field(default_factory=RFTConfig)
    dpo: DPOConfig = Field(default_factory=DPOConfig)
    distill: DistillConfig = Field(default_factory=DistillConfig)

    @model_validator(mode="after")
    def _modes_fit(self) -> Config:
        check_self_improve(self)
        check_dpo(self)
        check_critic(self)
        check_lora(self)
        check_distill(self)
        if self.algo.credit == "turn" and not self.env.enabled:
            raise ValueError(
                "algo.credit = 'turn' needs a multi-turn env (env.type); single-turn runs "
                "have one turn: use algo.credit = 'outcome'"
            )
        return self
