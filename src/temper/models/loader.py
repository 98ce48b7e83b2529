"""Loading causal language models and their tokenizers from a directory.

A model path is either an alias, `tiny` / `builtin:tiny` (the built-in tiny
chat model shipped in `temper/models/tiny/`) or `tiny-rm` / `builtin:tiny-rm`
(the built-in tiny reward model in `temper/models/tiny_rm/`, a one-label
sequence classifier for `temper serve-rm`), or a directory holding a Hugging
Face model (`config.json`, weights, tokenizer files). Anything else raises
`ModelLoadError` with a one-line message naming the path. A directory whose
config has a ``vision_config`` loads as a vision-language model
(`AutoModelForImageTextToText`, e.g. LLaVA).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from temper import compute
from temper.errors import ModelLoadError

TINY_DIR = Path(__file__).resolve().parent / "tiny"
TINY_RM_DIR = Path(__file__).resolve().parent / "tiny_rm"
ALIASES: dict[str, Path] = {
    "tiny": TINY_DIR,
    "builtin:tiny": TINY_DIR,
    "tiny-rm": TINY_RM_DIR,
    "builtin:tiny-rm": TINY_RM_DIR,
}


def resolve_model_path(path: str | Path) -> Path:
    """The directory for a model path or alias; raises ModelLoadError if it is missing."""
    text = str(path)
    if text in ALIASES:
        resolved = ALIASES[text]
        if not (resolved / "config.json").is_file():
            raise ModelLoadError(f"built-in model {text!r} is missing its files at {resolved}")
        return resolved
    resolved = Path(text).expanduser()
    if not resolved.is_dir():
        raise ModelLoadError(f"model path {text!r} does not exist or is not a directory")
    return resolved


def _first_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer (with its chat template) stored at a model path or alias."""
    directory = resolve_model_path(path)
    try:
        return AutoTokenizer.from_pretrained(directory)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"cannot load a tokenizer from {str(path)!r}: {_first_line(exc)}"
        ) from exc


def load_model(path: str | Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The causal LM stored at a model path or alias, in eval mode, with `dtype` weights."""
    directory = resolve_model_path(path)
    try:
        # Loaded on the compute thread, where its ops will run (see `temper.compute`).
        model = compute.run(_model_class(directory).from_pretrained, directory, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"cannot load a causal LM from {str(path)!r}: {_first_line(exc)}"
        ) from exc
    return model.eval()


def _model_class(directory: Path) -> Any:
    """`AutoModelForImageTextToText` for a vision-language model (its config has a
    ``vision_config``), else `AutoModelForCausalLM`."""
    import json

    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return AutoModelForCausalLM  # its own error names the problem
    if "vision_config" in config:
        from transformers import AutoModelForImageTextToText

        return AutoModelForImageTextToText
    return AutoModelForCausalLM
