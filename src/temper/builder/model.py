"""`RunModel`: what every component of a run derives from its model, made once per process.

The engine, the prompt renderer, the env rollouts and the trainer all need the
model's tokenizer, and for a vision-language model the same image processor
(whose caches they share) and the run's image store. `load_run_model` makes
them once and the builders pass the record down, so nothing re-derives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temper.config import Config
from temper.models import load_tokenizer, resolve_model_path
from temper.vision.processor import VisionProcessor, vision_for
from temper.vision.store import ImageStore


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


def load_run_model(cfg: Config, weights: str | None = None, images: bool = False) -> RunModel:
    """The `RunModel` of ``cfg``: weights from ``weights`` (default ``model.path``), the
    tokenizer stored with them, the image processor of a vision-language model (none
    for a remote engine: it runs no model here) and, with ``images``, the run's store."""
    base = str(resolve_model_path(cfg.model.path))
    weights = str(resolve_model_path(weights)) if weights is not None else base
    vision = vision_for(base) if cfg.engine.local else None
    store = run_image_store(cfg) if images else None
    return RunModel(weights, base, load_tokenizer(weights), vision, store)
