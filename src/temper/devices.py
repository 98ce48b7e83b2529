"""Where tensors live: ``"auto"`` (CUDA when one is present, else CPU), ``"cpu"``, ``"cuda"``.

Every component that holds tensors (the trainer, the native and vLLM engines)
takes a device from the config and resolves it here, once, at build time.
"""

from __future__ import annotations

from typing import Literal

import torch

from temper.errors import ConfigError

DeviceName = Literal["auto", "cpu", "cuda"]


def resolve_device(name: str, field: str = "device") -> torch.device:
    """The torch device for ``name``; ``"cuda"`` without CUDA is a `ConfigError` naming ``field``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"{field} = 'cuda' but torch sees no CUDA device (torch {torch.__version__})"
        )
    if name not in ("cpu", "cuda"):
        raise ConfigError(f"{field} must be 'auto', 'cpu' or 'cuda', got {name!r}")
    return torch.device(name)


def trainer_precision(precision: str, device: torch.device) -> str:
    """``"auto"`` is bf16 autocast on CUDA and fp32 on CPU; anything else stays."""
    if precision != "auto":
        return precision
    return "bf16" if device.type == "cuda" else "fp32"
