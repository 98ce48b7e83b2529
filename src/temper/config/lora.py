"""The `[lora]` config section: train a LoRA adapter instead of the whole policy.

Off unless ``lora.rank`` is set. With it the trainer wraps the policy with `peft`
(`temper.trainer.lora`): the base weights are frozen, only the adapters of
``target_modules`` get gradients and optimizer state, and each weight update sends
the adapter alone to the engines, which merge it into their own copy of the base
(docs/algorithms.md, "LoRA").

The defaults follow Thinking Machines' "LoRA Without Regret" (2025): every linear
layer of attention and MLP, ``alpha = 32`` with the usual ``alpha / rank`` scale, and
a learning rate about 10x the full fine-tuning one.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: Every linear layer of a Llama-family decoder block: attention, then MLP.
LINEAR_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    rank: int | None = Field(
        None,
        ge=1,
        description="LoRA rank r; setting it turns LoRA on (unset: full fine-tuning). "
        "LoRA Without Regret reports rank 1 matching full fine-tuning for RL.",
    )
    alpha: float = Field(
        32.0, gt=0, description="LoRA alpha: the update is scaled by alpha / rank."
    )
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on the adapter's input while training (makes the trainer's "
        "forward random: the logprob mismatch metrics then include it).",
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(LINEAR_LAYERS),
        min_length=1,
        description="Names of the linear layers that get an adapter (the last part of the "
        "module name), checked against the model when the trainer is built; default: every "
        "linear layer of attention and MLP.",
    )
    lr_multiplier: float = Field(
        10.0,
        gt=0,
        description="The adapters train at trainer.lr x this: trainer.lr stays the full "
        "fine-tuning rate (LoRA's best rate was about 10x it in LoRA Without Regret).",
    )

    @property
    def enabled(self) -> bool:
        return self.rank is not None

    @property
    def scale(self) -> float:
        """What the adapter's product B·A is multiplied by: alpha / rank."""
        assert self.rank is not None
        return self.alpha / self.rank

    @field_validator("target_modules")
    @classmethod
    def _plain_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not name or "." in name or name != name.strip():
                raise ValueError(
                    f"{name!r} is not a module name: give the last part of a linear layer's "
                    f"name, such as {', '.join(LINEAR_LAYERS[:3])}"
                )
        if len(set(names)) != len(names):
            raise ValueError("names a module twice")
        return names


def check_lora(cfg: Any) -> None:
    """Refuse a `[lora]` section that would do nothing, and what LoRA does not support
    (ValueError: exit 2). ``cfg`` is the whole run `Config`; whether the target modules
    exist is checked against the model when the trainer is built."""
    lora = cfg.lora
    if not lora.enabled:
        # Changed from its default, not merely set: a dumped config holds every field.
        if lora != LoraConfig():
            raise ValueError(
                "[lora] is set but lora.rank is not: set lora.rank (>= 1) to train a LoRA "
                "adapter, or remove [lora]"
            )
        return
    t = cfg.trainer
    split = [f"trainer.{k} = {v}" for k, v in (("tp", t.tp), ("pp", t.pp), ("ep", t.ep)) if v > 1]
    if split:
        raise ValueError(
            f"lora.rank with {split[0]}: LoRA trains over FSDP2's data parallelism only "
            "(peft's adapter layers are not split by tensor, pipeline or expert "
            "parallelism); set trainer.tp, pp and ep to 1"
        )
    if cfg.engine.type not in ("native", "hf", "vllm"):
        raise ValueError(
            f"lora.rank with engine.type = {cfg.engine.type!r}: adapter updates reach the "
            "native, hf and vllm engines; an endpoint takes no weight updates"
        )
    if cfg.engine.type == "vllm" and lora.rank > 512:
        raise ValueError(f"lora.rank = {lora.rank} with vLLM: vLLM takes ranks up to 512")
