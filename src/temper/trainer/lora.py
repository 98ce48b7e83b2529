"""A LoRA policy through `peft`: the adapters, what is published, saved and merged.

Imported only when ``[lora]`` is set (it imports peft, which the core path never
loads). `LoraAdapter.wrap` checks ``lora.target_modules`` against the model's own
linear layers and injects peft's LoRA layers into the HF model *in place*: the
model object the trainer already holds now computes ``W0 x + scale B A x`` in
every adapted layer, with W0 frozen and only A and B trainable. So the trainer's
forward, micro-batching and packing run unchanged on it (`policy`), and peft's
wrapper (`peft_model`) is kept for what peft does best: writing and reading the
adapter in its own format (``adapter_model.safetensors`` + ``adapter_config.json``)
and merging it for export.

What the engines get is `update`: two small tensors per layer in the format of
`temper.weights.adapter` (A, and B already multiplied by the scale), which they
merge into their own copy of the base weights.

A vision-language model gets adapters in its language model only: the vision tower
and the projector stay as loaded (peft's ``exclude_modules``), so an update never
changes an image's features and the engines keep the ones they encoded.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model, set_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file

from temper.config.lora import LoraConfig
from temper.errors import ConfigError
from temper.models.vlm_parts import IMAGE_SIDE_PREFIXES
from temper.weights.adapter import LORA_A, LORA_B

#: The name peft gives the one adapter Temper trains.
ADAPTER = "default"
#: The same as one regex over whole module names, as peft's ``exclude_modules`` takes it.
IMAGE_SIDE_PATTERN = "(" + "|".join(re.escape(p) for p in IMAGE_SIDE_PREFIXES) + ").*"
#: The files of an adapter in peft's format.
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def linear_layer_names(model: torch.nn.Module) -> list[str]:
    """The last parts of the names of ``model``'s linear layers that may take an adapter,
    sorted: its LM head too, but not a VLM's vision tower or projector."""
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and not name.startswith(IMAGE_SIDE_PREFIXES)
    }
    return sorted(names)


def has_image_side(model: torch.nn.Module) -> bool:
    """Whether ``model`` has modules that `IMAGE_SIDE_PREFIXES` names (a VLM)."""
    return any(name.startswith(IMAGE_SIDE_PREFIXES) for name, _ in model.named_modules())


def check_targets(model: torch.nn.Module, cfg: LoraConfig) -> None:
    """Refuse a target module name that names no linear layer of ``model`` (one line)."""
    have = linear_layer_names(model)
    unknown = [name for name in cfg.target_modules if name not in have]
    if unknown:
        where = " outside its vision tower and projector" if has_image_side(model) else ""
        raise ConfigError(
            f"lora.target_modules: {', '.join(map(repr, unknown))} names no linear layer of "
            f"{type(model).__name__}{where} (its linear layers: {', '.join(have)})"
        )


class LoraAdapter:
    """A policy whose adapted linear layers train LoRA adapters over frozen weights."""

    def __init__(self, peft_model: PeftModel, cfg: LoraConfig) -> None:
        self.peft_model = peft_model
        self.cfg = cfg
        #: The HF model itself, with peft's layers inside: what the trainer runs.
        self.policy: torch.nn.Module = peft_model.base_model.model
        self._layers = [
            (name, module)
            for name, module in self.policy.named_modules()
            if isinstance(module, LoraLayer)
        ]

    @classmethod
    def wrap(cls, model: torch.nn.Module, cfg: LoraConfig) -> LoraAdapter:
        """Inject adapters into ``model`` in place (checked first: `check_targets`); a
        VLM's image side gets none."""
        check_targets(model, cfg)
        config = PeftLoraConfig(
            r=cfg.rank,
            lora_alpha=cfg.alpha,
            lora_dropout=cfg.dropout,
            target_modules=list(cfg.target_modules),
            exclude_modules=IMAGE_SIDE_PATTERN if has_image_side(model) else None,
            bias="none",
        )
        with warnings.catch_warnings():  # transformers' deprecation notes, not ours to fix
            warnings.simplefilter("ignore", FutureWarning)
            peft_model = get_peft_model(model, config)
        return cls(peft_model, cfg)

    def update(self) -> dict[str, torch.Tensor]:
        """The adapter as the engines take it (`temper.weights.adapter`): per adapted
        layer its A and its scaled B, fresh tensors (the trainer may change its own
        in place once the engines loaded them)."""
        out: dict[str, torch.Tensor] = {}
        for name, layer in self._layers:
            a = layer.lora_A[ADAPTER].weight.detach()
            b = layer.lora_B[ADAPTER].weight.detach()
            out[name + LORA_A] = a.clone()
            out[name + LORA_B] = b * layer.scaling[ADAPTER]
        return out

    def trainable(self) -> dict[str, torch.Tensor]:
        """The tensors that train (the adapters), by parameter name, detached."""
        return {n: p.detach() for n, p in self.policy.named_parameters() if p.requires_grad}

    def numel(self) -> int:
        """How many values the adapters hold."""
        return sum(t.numel() for t in self.trainable().values())

    def save(self, directory: Path) -> None:
        """Write the adapter in peft's format into ``directory``."""
        with warnings.catch_warnings():  # transformers' deprecation notes, not ours to fix
            warnings.simplefilter("ignore", FutureWarning)
            self.peft_model.save_pretrained(str(directory), safe_serialization=True)

    def load(self, directory: Path) -> None:
        """Read the adapter in ``directory`` (peft's format) into this one; a checkpoint
        whose adapter has another rank or other layers than ``[lora]`` now gives is
        refused in one line."""
        config_file, weights = directory / ADAPTER_CONFIG, directory / ADAPTER_WEIGHTS
        if not config_file.is_file() or not weights.is_file():
            raise ConfigError(
                f"{directory} holds no LoRA adapter ({ADAPTER_CONFIG}, {ADAPTER_WEIGHTS}): "
                "it was not written with [lora] set"
            )
        saved = json.loads(config_file.read_text())
        targets = sorted(saved.get("target_modules") or [])
        if saved.get("r") != self.cfg.rank or targets != sorted(self.cfg.target_modules):
            raise ConfigError(
                f"{directory} holds a LoRA adapter of rank {saved.get('r')} on {targets}; "
                f"[lora] asks for rank {self.cfg.rank} on {sorted(self.cfg.target_modules)}"
            )
        result = set_peft_model_state_dict(self.peft_model, load_file(str(weights)))
        if result.unexpected_keys:
            raise ConfigError(f"{weights}: unknown adapter tensors {result.unexpected_keys[:3]}")

    def merged_model(self) -> torch.nn.Module:
        """The HF model with every adapter merged into its weights (for export): peft's
        layers are removed, so this object no longer trains."""
        return self.peft_model.merge_and_unload()
