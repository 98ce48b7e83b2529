"""The `[env]` config section: which environment a run's episodes use, and the limits the
rollout loop enforces on each episode (`EpisodeLimits`, also what env authors and the
eval suites pass around)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class EpisodeLimits(BaseModel):
    """Limits the rollout loop enforces on every episode.

    Token limits clip each turn's `max_new_tokens` so a turn never overruns
    them; an observation that would not leave room for one more generated
    token is not appended and the episode ends with "token_budget".
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int = Field(
        8, ge=1, le=1000, description="Assistant turns per episode (each turn = one generate)."
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="Wall-clock seconds per episode, reset and env steps included; "
        "None = no limit. On expiry the turn in flight is cancelled and dropped.",
    )
    max_total_tokens: int | None = Field(
        None,
        ge=2,
        description="Most tokens in the whole context (prompt + all turns + observations); "
        "None = the engine's max_context. The smaller of the two applies.",
    )
    max_generated_tokens: int | None = Field(
        None, ge=1, description="Most sampled (policy) tokens over all turns; None = no limit."
    )
    continue_after_length: bool = Field(
        False,
        description="When a turn hits max_new_tokens: False ends the episode with 'length'; "
        "True closes the turn with the template's end-of-turn tokens (loss mask 0) and "
        "steps the env on the truncated turn.",
    )


class EnvConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    type: str = Field(
        "none",
        min_length=1,
        description='"none": single-turn prompts from `data`, scored by `reward`. Otherwise a '
        "multi-turn env: a built-in (tool_use, code, guess_number, wordle, arithmetic_chain, gym, visual_grid, miniwob, openenv) or "
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
    servers: list[str] = Field(
        default_factory=list,
        description="Env servers (`temper env-serve`) to play the episodes on, as "
        '"ws://host:port/v1" URLs; empty = in this process. The run still builds its '
        "tasks from `type` and `options`; each server must serve the same env.",
    )
    ray_servers: int = Field(
        0,
        ge=0,
        le=4096,
        description="Env servers this run starts as Ray actors (one CPU each) and plays its "
        "episodes on, with any `servers` listed; 0 = none. Needs Ray (the local "
        "cluster, or orchestrator.ray_address).",
    )
    call_timeout_s: float = Field(
        300.0, gt=0, description="Seconds one call to an env server may take (reset or step)."
    )
    infra_retries: int = Field(
        2,
        ge=0,
        le=10,
        description="Times an episode the infrastructure failed (a server lost, a wire "
        "timeout) is played again; one that still fails is left out of training.",
    )

    @field_validator("servers")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("ws://", "wss://")):
                raise ValueError(f"env.servers: {url!r} is not a ws:// or wss:// URL")
        return urls

    @property
    def enabled(self) -> bool:
        return self.type != "none"
