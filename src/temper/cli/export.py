"""`temper export CHECKPOINT OUT`: a LoRA checkpoint as a merged HF model and a peft adapter.

A checkpoint of a run with ``[lora]`` holds the adapter (peft's
``adapter_model.safetensors`` and ``adapter_config.json``), not a model, so
``model.path`` cannot point at it. Export writes

- ``OUT/``: the base model with the adapter merged into its weights (``W0 + scale
  B A``), and the tokenizer (a VLM's whole processor): an HF model directory like
  any other;
- ``OUT/adapter/``: the adapter alone, in peft's format, as the checkpoint holds it
  (``PeftModel.from_pretrained(base, OUT/adapter)`` loads it).

The base is the model the adapter was trained on (``base_model_name_or_path`` in its
config, which the trainer wrote), or ``--base``. Everything is written under a
temporary name beside ``OUT`` and renamed into place, so a failed export leaves
nothing. A checkpoint of full fine-tuning is already an HF model directory: it is
refused in one line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from temper.errors import ConfigError

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")


def add_parser(sub: Any) -> None:
    x = sub.add_parser(
        "export",
        help="a LoRA checkpoint as a merged HF model (and its adapter in peft's format)",
        description="Write a LoRA checkpoint's base model with the adapter merged in to OUT, "
        "and the adapter alone, in peft's format, to OUT/adapter.",
    )
    x.add_argument("checkpoint", help="a checkpoint directory (runs/X/checkpoints/step_N)")
    x.add_argument("out", help="new (or empty) directory for the merged model")
    x.add_argument(
        "--base", default=None, help="the base model (default: the adapter config's base)"
    )
    x.add_argument("--verbose", action="store_true", help="show transformers' progress bars")


def cmd_export(args: argparse.Namespace) -> int:
    ckpt, out = Path(args.checkpoint), Path(args.out)
    saved = _adapter_config(ckpt)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} exists and is not an empty directory: choose a new one")
    base = args.base or saved.get("base_model_name_or_path")
    if not base:
        raise ConfigError(f"{ckpt}/adapter_config.json names no base model: pass --base MODEL")

    from temper.builder.model import quiet_libraries
    from temper.builder.trainer import build_lora
    from temper.config.lora import LoraConfig
    from temper.models import load_model, load_tokenizer
    from temper.vision.processor import VisionProcessor

    quiet_libraries()
    lora = LoraConfig(
        rank=saved["r"],
        alpha=saved["lora_alpha"],
        target_modules=sorted(saved["target_modules"]),
    )
    adapter = build_lora(lora, load_model(base))
    adapter.load(ckpt)
    merged = adapter.merged_model()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        merged.save_pretrained(tmp, safe_serialization=True)
        # A VLM's checkpoint holds its processor (tokenizer, image processor, template).
        vision = VisionProcessor.from_pretrained(ckpt)
        (load_tokenizer(ckpt) if vision is None else vision.processor).save_pretrained(tmp)
        (tmp / "adapter").mkdir()
        for name in ADAPTER_FILES:
            shutil.copy2(ckpt / name, tmp / "adapter" / name)
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"merged model: {out}\nadapter: {out / 'adapter'}")
    return 0


def _adapter_config(ckpt: Path) -> dict[str, Any]:
    """The checkpoint's adapter config; one line for anything that is not a LoRA
    checkpoint."""
    if not ckpt.is_dir():
        raise ConfigError(f"checkpoint {str(ckpt)!r} is not a directory")
    missing = [name for name in ADAPTER_FILES if not (ckpt / name).is_file()]
    if missing and (ckpt / "config.json").is_file():
        raise ConfigError(
            f"{ckpt} holds a whole model, not a LoRA adapter: it is an HF model directory "
            "already (model.path can point at it)"
        )
    if missing:
        raise ConfigError(f"{ckpt} is not a LoRA checkpoint (no {', '.join(missing)})")
    try:
        saved = json.loads((ckpt / "adapter_config.json").read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{ckpt}/adapter_config.json is not valid JSON ({err})") from None
    if not isinstance(saved, dict) or not {"r", "lora_alpha", "target_modules"} <= set(saved):
        raise ConfigError(f"{ckpt}/adapter_config.json is not a LoRA adapter config")
    return saved
