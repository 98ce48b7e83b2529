"""Loading causal language models and their tokenizers from a directory.

A model path is either an alias, `tiny` / `builtin:tiny` (the built-in tiny
chat model shipped in `temper/models/tiny/`), `tiny-rm` / `builtin:tiny-rm`
(the built-in tiny reward model in `temper/models/tiny_rm/`, a one-label
sequence classifier for `temper serve-rm`) or `tiny_vlm` / `tiny-vlm` /
`builtin:tiny_vlm` (the built-in tiny vision-language model, a LLaVA, in
`temper/models/tiny_vlm/`), or a directory holding a Hugging Face model
(`config.json`, weights, tokenizer files; a vision-language model also its
processor config). Anything else raises `ModelLoadError` with a one-line
message naming the path.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import (
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    PreTrainedModel,
)
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from temper import compute
from temper.errors import ModelLoadError

TINY_DIR = Path(__file__).resolve().parent / "tiny"
TINY_RM_DIR = Path(__file__).resolve().parent / "tiny_rm"
TINY_VLM_DIR = Path(__file__).resolve().parent / "tiny_vlm"
TINY_MOE_DIR = Path(__file__).resolve().parent / "tiny_moe"
ALIASES: dict[str, Path] = {
    "tiny": TINY_DIR,
    "builtin:tiny": TINY_DIR,
    "tiny-rm": TINY_RM_DIR,
    "builtin:tiny-rm": TINY_RM_DIR,
    "tiny_vlm": TINY_VLM_DIR,
    "tiny-vlm": TINY_VLM_DIR,
    "builtin:tiny_vlm": TINY_VLM_DIR,
    "tiny-moe": TINY_MOE_DIR,
    "builtin:tiny-moe": TINY_MOE_DIR,
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
    if not resolved.exists():
        raise ModelLoadError(f"model path {text!r} does not exist")
    if not resolved.is_dir():
        raise ModelLoadError(f"model path {text!r} is a file, not a model directory")
    return resolved


#: Files one of which a directory holding a tokenizer has (fast, SentencePiece, BPE, WordPiece).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)


def model_config(path: str | Path) -> dict[str, Any]:
    """The ``config.json`` of a model path or alias, checked: a directory without one, or
    with one that is not a JSON object, raises `ModelLoadError` (one line)."""
    directory = resolve_model_path(path)
    file = directory / "config.json"
    if not file.is_file() and (directory / "adapter_config.json").is_file():
        raise ModelLoadError(
            f"model path {str(path)!r} holds a LoRA adapter, not a model: `temper export "
            f"{path} OUT` writes the merged model to OUT"
        )
    if not file.is_file():
        raise ModelLoadError(f"model path {str(path)!r} is not a model directory (no config.json)")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelLoadError(
            f"model path {str(path)!r}: config.json is not valid JSON ({_one_line(exc)})"
        ) from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"model path {str(path)!r}: config.json is not a JSON object")
    return config


def _one_line(exc: BaseException, limit: int = 400) -> str:
    """An exception's whole message on one line (its lines joined); a longer one is cut
    after its last whole sentence within ``limit`` characters."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if not text:
        return type(exc).__name__
    if len(text) <= limit:
        return text
    end = text.rfind(". ", 0, limit)
    return text[: end + 1] if end > 0 else text[:limit].rsplit(" ", 1)[0] + " ..."


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer (with its chat template) stored at a model path or alias.

    A directory without tokenizer files is refused in one line: as not a model
    directory when it has no ``config.json`` either, else as having no tokenizer;
    a ``config.json`` that is there must be valid. (A directory with only the
    tokenizer files loads: an ``openai`` engine needs no weights.)"""
    directory = resolve_model_path(path)
    has_config = (directory / "config.json").exists()
    if has_config:
        model_config(directory)
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        if not has_config:
            model_config(path)  # raises: not a model directory
        raise ModelLoadError(
            f"model path {str(path)!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)})"
        )
    try:
        return AutoTokenizer.from_pretrained(directory)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelLoadError(
            f"cannot load a tokenizer from {str(path)!r}: {_one_line(exc)}"
        ) from exc


def is_vision_language(path: str | Path) -> bool:
    """True if the model's config has a vision tower (`vision_config`): an image-text model."""
    try:
        config = json.loads((resolve_model_path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "vision_config" in config


def load_model(path: str | Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The causal LM stored at a model path or alias, in eval mode, with `dtype` weights.

    A vision-language model (see `is_vision_language`) loads as its image-text-to-text
    class (for the tiny VLM, `LlavaForConditionalGeneration`), which takes
    `pixel_values` beside the token ids.
    """
    directory = resolve_model_path(path)
    vision = "vision_config" in model_config(path)
    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    try:
        # Loaded on the compute thread, where its ops will run (see `temper.compute`).
        model = compute.run(auto.from_pretrained, directory, dtype=dtype)
    except (OSError, ValueError, SafetensorError) as exc:
        kind = "an image-text model" if vision else "a causal LM"
        raise ModelLoadError(f"cannot load {kind} from {str(path)!r}: {_one_line(exc)}") from exc
    return model.eval()


def load_processor(path: str | Path) -> Any:
    """The processor (image processor, tokenizer, chat template) of a vision-language model."""
    directory = resolve_model_path(path)
    try:
        return AutoProcessor.from_pretrained(directory)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"cannot load a processor from {str(path)!r}: {_one_line(exc)}"
        ) from exc


@functools.lru_cache(maxsize=16)
def longest_token_chars(tokenizer: Any) -> int:
    """The length of the longest token string in the vocabulary (at least 1).

    An upper bound on the characters one token covers: byte-level BPE writes
    one character per byte (and a character is at least one byte),
    SentencePiece one per character, byte-fallback tokens such as ``<0x41>``
    more. A normalizer that deletes characters could break the bound; none of
    the usual ones do.
    """
    return max((len(token) for token in tokenizer.get_vocab()), default=1) or 1


def quiet_transformers() -> None:
    """Keep the terminal for Temper's own progress: no per-load bars or warnings from
    transformers (the CLI, rollout worker processes and Ray actors all call it)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
