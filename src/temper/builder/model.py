"""`RunModel`: what every component of a run derives from its model, made once per process.

The engine, the prompt renderer, the env rollouts and the trainer all need the
model's tokenizer, and for a vision-language model the same image processor
(whose caches they share) and the run's image store. `load_run_model` makes
them once and the builders pass the record down, so nothing re-derives them. The
tokenizer carries the chat template ``model.chat_template`` chooses
(`temper.models.templates`), checked here, before anything runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temper.config import Config
from temper.models import load_tokenizer, resolve_model_path
from temper.models.loader import quiet_transformers
from temper.models.templates import install_chat_template
from temper.vision.processor import VisionProcessor, vision_for
from temper.vision.store import ImageStore

#: "1" (as `temper ... --verbose` sets it): transformers keeps its progress bars
#: ("Loading weights") and warnings; otherwise `load_run_model` turns them off.
VERBOSE_ENV = "TEMPER_VERBOSE"


def quiet_libraries() -> None:
    """Turn off transformers' progress bars and warnings, unless ``VERBOSE_ENV`` asks
    for them: the terminal is kept for Temper's own progress."""
    if os.environ.get(VERBOSE_ENV, "").strip() in ("", "0"):
        quiet_transformers()


@dataclass(frozen=True)
class RunModel:
    """A run's model, as its components see it.

    ``weights`` is where the engines and the trainer load weights from (the base
    model, or the checkpoint a run resumes); ``base`` is ``model.path`` resolved
    (a KL reference and the image processor come from it). ``vision`` is None for
    a text model or a remote engine; ``images`` is None where no image store is
    kept (eval, serving).
    """

    weights: str
    base: str
    tokenizer: Any
    vision: VisionProcessor | None
    images: ImageStore | None

    def with_images(self, images: ImageStore | None) -> RunModel:
        return RunModel(self.weights, self.base, self.tokenizer, self.vision, images)


def run_image_store(cfg: Config) -> ImageStore:
    """The run's image store: ``<run.output_dir>/<run.name>/images``."""
    return ImageStore(Path(cfg.run.output_dir) / cfg.run.name / "images")


def load_run_model(
    cfg: Config, weights: str | None = None, images: bool = False, prompts: bool = True
) -> RunModel:
    """The `RunModel` of ``cfg``: weights from ``weights`` (default ``model.path``), the
    tokenizer stored with them, with the chat template ``model.chat_template`` chooses,
    the image processor of a vision-language model (none for a remote engine: it runs
    no model here) and, with ``images``, the run's store.

    ``prompts``: this process renders prompts, so ``model.chat_template = "auto"`` on a
    tokenizer without a template is an error (`ConfigError`, one line); a server,
    whose chat endpoint reports a missing template per request, passes False."""
    quiet_libraries()  # before anything here loads: no "Loading weights" bars
    base = str(resolve_model_path(cfg.model.path))
    weights = str(resolve_model_path(weights)) if weights is not None else base
    tokenizer = load_tokenizer(weights)
    install_chat_template(tokenizer, cfg.model.chat_template, cfg.model.path, required=prompts)
    vision = vision_for(base) if cfg.engine.local else None
    store = run_image_store(cfg) if images else None
    return RunModel(weights, base, tokenizer, vision, store)
