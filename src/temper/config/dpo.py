"""The `[dpo]` config section: Direct Preference Optimization, ``trainer.mode = "dpo"``.

DPO trains on pairs of responses to one prompt, a chosen and a rejected one,
against a frozen reference (the starting policy): from a dataset of pairs, or
online from the run's own samples ranked by its reward (docs/algorithms.md, DPO).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class DPOConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    beta: float = Field(
        0.1,
        gt=0,
        description="Strength of the pull towards the reference: the implicit reward is "
        "beta x (log pi - log pi_ref) of a response; IPO's target margin is 1 / (2 beta).",
    )
    loss: Literal["sigmoid", "ipo"] = Field(
        "sigmoid",
        description="sigmoid: DPO's -log sigmoid(beta x margin); ipo: IPO's squared loss "
        "(margin - 1 / (2 beta))^2, both on summed response logprobs.",
    )
    label_smoothing: float = Field(
        0.0,
        ge=0,
        lt=0.5,
        description="loss=sigmoid: the probability that a pair's label is wrong (cDPO); "
        "0 is plain DPO.",
    )
    pairs: Literal["dataset", "online"] = Field(
        "dataset",
        description="dataset: each step trains on orchestrator.prompts_per_step pairs of "
        "`source`; online: each step samples orchestrator.group_size responses per prompt "
        "of the run's tasks, scores them with the run's reward, and pairs the best against "
        "the worst of each group (groups of equal rewards give no pair).",
    )
    source: Literal["tiny_rm", "file"] = Field(
        "tiny_rm",
        description="pairs=dataset: the built-in synthetic preference pairs the tiny reward "
        "model was trained on (temper.data.preferences), or the rows of `path`.",
    )
    path: str | None = Field(
        None,
        description="source=file: preference pairs (.jsonl, .json or .parquet), one per row: "
        "a prompt (text or chat messages), a chosen and a rejected response (text or "
        "assistant messages).",
    )
    eval_path: str | None = Field(
        None,
        description="source=file: held-out pairs for the preference eval; if unset, "
        "eval_size rows of `path` are split off (at most a fifth).",
    )
    prompt_field: str = Field("prompt", description="Column holding a pair's prompt.")
    chosen_field: str = Field("chosen", description="Column holding the preferred response.")
    rejected_field: str = Field("rejected", description="Column holding the dispreferred response.")
    size: int = Field(
        512, ge=1, description="source=tiny_rm: how many training pairs are generated."
    )
    eval_size: int = Field(
        64,
        ge=1,
        description="Held-out pairs whose implicit-reward accuracy each eval reports "
        "(eval/preference_accuracy).",
    )

    @model_validator(mode="after")
    def _file_needs_path(self) -> DPOConfig:
        if self.source == "file" and not self.path:
            raise ValueError("dpo.path is required when dpo.source = 'file'")
        if self.loss == "ipo" and self.label_smoothing:
            raise ValueError(
                "dpo.label_smoothing applies to dpo.loss = 'sigmoid' only; set it to 0 for ipo"
            )
        return self


def check_dpo(cfg: Any) -> None:
    """Refuse what ``trainer.mode = "dpo"`` does not support (ValueError: exit 2); the
    checks every self-improvement mode shares are `check_self_improve`'s.

    ``cfg`` is the whole `temper.config.Config` (not imported: no import circle).
    """
    if cfg.trainer.mode != "dpo":
        return
    if cfg.dpo.pairs == "online" and cfg.orchestrator.group_size < 2:
        raise ValueError(
            f"dpo.pairs = 'online' pairs samples within a group: orchestrator.group_size = "
            f"{cfg.orchestrator.group_size} gives no pair; use group_size >= 2"
        )
