"""The `[algo]` config section: advantages, the policy objective, KL, off-policy
corrections and credit assignment (docs/algorithms.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class AlgoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    advantage: Literal[
        "grpo",
        "grpo_no_std",
        "dr_grpo",
        "rloo",
        "reinforce_pp_baseline",
        "reinforce_pp",
        "gae",
        "distill",
    ] = Field(
        "grpo",
        description="Advantage estimator over each prompt's group: grpo (reward minus group "
        "mean, over group std), grpo_no_std / dr_grpo (minus the mean only), rloo (minus the "
        "mean of the others), reinforce_pp_baseline (group mean baseline, batch-normalised), "
        "reinforce_pp (full REINFORCE++: per-token returns with reward_kl_coef * KL in the "
        "reward, normalised over the batch; docs/algorithms.md), gae (PPO with a learned "
        "value: GAE against the [critic] section's value function), distill (on-policy "
        "distillation: each sampled token's log p_teacher - log p_student, from the "
        "[distill] section's teacher).",
    )
    policy_loss: Literal["ppo", "gspo", "cispo"] = Field(
        "ppo",
        description="Policy objective: ppo (per-token clipped ratio, clip_low/high, dual_clip), "
        "gspo (one length-normalised ratio per sequence, clipped by gspo_clip_low/high), "
        "cispo (clipped, stop-gradient IS weight times A times logp; cispo_clip_low/high). "
        "docs/algorithms.md.",
    )
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = Field(
        "token-mean",
        description="How per-token losses become one number: mean over all tokens of the "
        "batch, or per sequence (sum or mean of its tokens) then mean over sequences.",
    )
    clip_low: float = Field(0.2, ge=0, description="PPO ratio clip below 1 (1 - clip_low).")
    clip_high: float = Field(0.28, ge=0, description="PPO ratio clip above 1 (DAPO clip-higher).")
    dual_clip: float | None = Field(
        None, gt=1, description="Dual-clip constant c > 1, or off (policy_loss = ppo only)."
    )
    gspo_clip_low: float = Field(
        3e-4, ge=0, lt=1, description="GSPO sequence-ratio clip below 1 (the paper's 3e-4)."
    )
    gspo_clip_high: float = Field(
        4e-4, ge=0, description="GSPO sequence-ratio clip above 1 (the paper's 4e-4)."
    )
    cispo_clip_low: float = Field(
        1.0, ge=0, description="CISPO weight floor 1 - cispo_clip_low; >= 1 = no floor (report)."
    )
    cispo_clip_high: float = Field(0.28, ge=0, description="CISPO weight cap 1 + cispo_clip_high.")
    kl_coef: float = Field(
        0.0, ge=0, description="KL penalty in the loss vs the reference model (0 = none)."
    )
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="Per-token KL estimator (Schulman's k1, k2, k3) when kl_coef > 0."
    )
    reward_kl_coef: float = Field(
        0.0,
        ge=0,
        description="advantage = reinforce_pp: coefficient of the per-token KL to the reference "
        "model in the reward (REINFORCE++'s beta); 0 = no KL, no reference model.",
    )
    reward_kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k1", description="Per-token KL estimator in the reward (REINFORCE++ uses k1)."
    )
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus coefficient.")
    off_policy_correction: Literal["none", "behaviour", "tis", "mis", "decoupled"] = Field(
        "none",
        description="Importance-sampling correction for stale or mismatched rollouts "
        "(temper.algos.off_policy): none, behaviour (PPO around the engine's logprobs), "
        "tis (truncated), mis (masked) or decoupled PPO.",
    )
    is_level: Literal["token", "sequence"] = Field(
        "token", description="tis/mis: one importance ratio per token or per sequence."
    )
    is_cap: float = Field(2.0, gt=0, description="tis truncation / mis upper bound C.")
    is_low: float = Field(0.0, ge=0, description="mis lower bound (ratios below are masked).")
    credit: Literal["outcome", "turn"] = Field(
        "outcome",
        description="Multi-turn credit assignment: outcome (every token gets the episode's "
        "advantage) or turn (each turn's tokens get the advantage of its discounted return "
        "from that turn on, against the group's at the same turn index; env runs only).",
    )
    turn_discount: float = Field(
        1.0, ge=0, le=1, description="credit = turn: discount gamma from one turn to the next."
    )
    gae_gamma: float = Field(
        1.0,
        ge=0,
        le=1,
        description="advantage = gae, credit = outcome: discount per token (credit = turn "
        "discounts per turn with turn_discount).",
    )
    gae_lambda: float = Field(
        1.0,
        ge=0,
        le=1,
        description="advantage = gae: GAE's lambda (1 = Monte-Carlo return minus the value; "
        "lower leans on the critic's own estimates).",
    )
    gae_whiten: bool = Field(
        True,
        description="advantage = gae: normalise advantages to mean 0, std 1 over the step's "
        "policy tokens.",
    )

    @model_validator(mode="after")
    def _discount_needs_turn_credit(self) -> AlgoConfig:
        if self.turn_discount != 1.0 and self.credit != "turn":
            raise ValueError(
                f"algo.turn_discount = {self.turn_discount} applies only with algo.credit = "
                "'turn' (outcome credit has no turns to discount)"
            )
        return self

    @model_validator(mode="after")
    def _gae_fields_need_gae(self) -> AlgoConfig:
        # Changed from its default, not merely set: a dumped config holds every field.
        values = dict(self)
        gae_set = {
            name
            for name in ("gae_gamma", "gae_lambda", "gae_whiten")
            if values[name] != type(self).model_fields[name].default
        }
        if gae_set and self.advantage != "gae":
            raise ValueError(
                f"algo.{sorted(gae_set)[0]} applies only with algo.advantage = 'gae' "
                f"(not {self.advantage!r})"
            )
        if self.advantage == "gae" and self.credit == "turn" and self.gae_gamma != 1.0:
            raise ValueError(
                "algo.gae_gamma discounts per token (credit = 'outcome'); turn-level GAE "
                "discounts per turn: set algo.turn_discount instead"
            )
        return self

    @model_validator(mode="after")
    def _is_band(self) -> AlgoConfig:
        if self.is_low >= self.is_cap:
            raise ValueError(
                f"algo.is_low ({self.is_low}) must be below algo.is_cap ({self.is_cap})"
            )
        if self.dual_clip is not None and self.policy_loss != "ppo":
            raise ValueError(
                f"algo.dual_clip bounds the PPO clip only; it does nothing for algo.policy_loss "
                f"= {self.policy_loss!r} (unset dual_clip or use policy_loss = 'ppo')"
            )
        if self.reward_kl_coef > 0 and self.advantage != "reinforce_pp":
            raise ValueError(
                f"algo.reward_kl_coef puts KL in the reward of algo.advantage = 'reinforce_pp' "
                f"only, not {self.advantage!r} (use kl_coef for a KL loss term)"
            )
        return self

    @property
    def uses_reference(self) -> bool:
        """Whether the trainer needs the frozen reference model (a KL term somewhere)."""
        return self.kl_coef > 0 or self.reward_kl_coef > 0
