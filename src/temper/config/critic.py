"""The `[critic]` config section: PPO's learned value function (``algo.advantage = "gae"``).

Two kinds (docs/algorithms.md, "PPO with a critic"):

- ``model``: a separate value model, a causal LM whose output layer is replaced
  by one linear unit, initialised from ``model_path`` (default: the policy's
  starting weights). Its own optimizer; it costs a second model's memory and
  a forward and backward of it per critic step.
- ``head``: one linear unit on the policy's last hidden state. The policy's
  trunk gets no value-loss gradient (the head reads detached features), so
  the value loss never moves the policy; it costs one no-grad policy forward
  per step and almost no memory.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class CriticConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    kind: Literal["model", "head"] = Field(
        "model",
        description="The value function: a separate value model, or a linear head on the "
        "policy's (detached) last hidden state.",
    )
    model_path: str | None = Field(
        None,
        description="kind = model: the value model's starting weights (an HF directory or a "
        "built-in model name); default: the policy's model.path.",
    )
    lr: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Critic learning rate; default: 10 x trainer.lr (a value starts at 0 and "
        "must reach the returns' scale; verl's and OpenRLHF's PPO examples train the critic "
        "at about 10x the policy's rate too).",
    )
    grad_clip: float = Field(1.0, gt=0, description="Max grad norm of the critic's parameters.")
    value_clip: float | None = Field(
        0.2,
        gt=0,
        description="Clip each value within +-value_clip of its value at the step's start "
        "in the loss (PPO2's value clipping); unset = plain squared error.",
    )
    warmup_steps: int = Field(
        0,
        ge=0,
        description="Train only the critic for this many first steps (the policy is not "
        "updated), so its values mean something before they set advantages.",
    )


def check_critic(cfg: Any) -> None:
    """Refuse a `[critic]` section that would do nothing, and what the critic does not
    support yet (ValueError: exit 2). ``cfg`` is the whole run `Config`."""
    # Changed from its default, not merely set: a dumped config holds every field.
    critic_set = cfg.critic != CriticConfig()
    if cfg.algo.advantage != "gae":
        if critic_set:
            raise ValueError(
                f"[critic] is set but algo.advantage = {cfg.algo.advantage!r} has no critic; "
                "use algo.advantage = 'gae' (PPO with a learned value) or remove [critic]"
            )
        return
    if cfg.trainer.mode != "rl":
        raise ValueError(
            f"algo.advantage = 'gae' trains a critic for RL; trainer.mode = "
            f"{cfg.trainer.mode!r} has no rewards to learn values of"
        )
    if cfg.trainer.world_size > 1:
        raise ValueError("algo.advantage = 'gae' trains at trainer.world_size = 1 only so far")
    if cfg.orchestrator.refill:
        raise ValueError(
            "orchestrator.refill replaces groups of equal rewards, which GRPO cannot learn "
            "from; with algo.advantage = 'gae' the critic is the baseline and every group "
            "trains: set orchestrator.refill = false"
        )
    if cfg.critic.kind == "head" and cfg.critic.model_path is not None:
        raise ValueError(
            "critic.model_path applies to critic.kind = 'model'; a head reads the policy itself"
        )
