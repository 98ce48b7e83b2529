"""Where a vision-language model's image side lives in its HF parameter names.

The trainer freezes the vision tower by these prefixes and LoRA leaves the whole image
side (tower and projector) out of its adapters. Kept here, below both, so that neither
imports the other for a list of names.
"""

from __future__ import annotations

#: Parameter-name prefixes of HF vision encoders (LLaVA, Qwen2-VL, Idefics3/SmolVLM).
VISION_TOWER_PREFIXES = (
    "model.vision_tower.",
    "vision_tower.",
    "model.visual.",
    "visual.",
    "model.vision_model.",
    "vision_model.",
)
#: Module-name prefixes of a VLM's image side: the vision tower and the projector that
#: maps its features into the language model. A text model has none of them.
IMAGE_SIDE_PREFIXES = (
    *VISION_TOWER_PREFIXES,
    "model.multi_modal_projector.",
    "multi_modal_projector.",
    "model.connector.",
    "connector.",
)
