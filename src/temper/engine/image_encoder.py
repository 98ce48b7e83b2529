"""The native engine's image side for LLaVA-style models: encode each image once.

A LLaVA-style VLM is a vision tower, a projector and a Llama-family language
model. The language model's input at an image's token run is the projected
vision features of that image, one row per token; everything after that is the
text model the native forward already runs (`temper.engine.llama_forward`).
So the native engine splits the VLM in two:

- `text_model_of(vlm)`: the language model as an HF ``*ForCausalLM`` sharing
  the VLM's tensors (the native forward copies its weights as for a text model);
- `ImageEncoder`: a copy of the vision tower and projector, run through the
  HF model's own ``get_image_features``, with the features of each image kept
  by content hash until the weights change. A prompt's images therefore cost
  one vision forward the first time any request shows them, and none after,
  however many samples, turns or groups share them.

Only LLaVA-style models qualify: one position per token (no multimodal RoPE)
and a Llama-family language model. Qwen2-VL and the like raise
`UnsupportedModelError`; the HF and vLLM engines run them.

Weight updates arrive under the VLM's HF names (``model.language_model.*``,
``model.vision_tower.*``, ``model.multi_modal_projector.*``, ``lm_head.*``);
`split_vlm_state_dict` sends each to its side.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from temper.engine.llama_forward import UnsupportedModelError
from temper.errors import TemperError
from temper.vision.images import Image
from temper.vision.processor import VisionProcessor, image_spans

#: VLM model types whose images become plain token embeddings at 1-D positions.
SUPPORTED_VLM_TYPES = ("llava",)
_TEXT_PREFIX = "model.language_model."
_VISION_PREFIXES = ("model.vision_tower.", "model.multi_modal_projector.")
#: Encoded images kept per weight version (features are small: tokens x hidden).
CACHE_SIZE = 4096


def is_vlm(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a vision-language model (its config has a vision part)."""
    return getattr(model.config, "vision_config", None) is not None


def check_vlm_supported(model: torch.nn.Module) -> None:
    model_type = getattr(model.config, "model_type", None)
    if model_type not in SUPPORTED_VLM_TYPES:
        raise UnsupportedModelError(
            f"native engine runs {', '.join(SUPPORTED_VLM_TYPES)} vision-language models, "
            f"not model_type={model_type!r}; use engine.type = 'hf' or 'vllm' for this model"
        )


def text_model_of(vlm: torch.nn.Module) -> torch.nn.Module:
    """The VLM's language model as an HF causal LM that shares the VLM's tensors."""
    from transformers import AutoModelForCausalLM

    check_vlm_supported(vlm)
    with torch.device("meta"):  # an empty shell: its parts are replaced below
        shell = AutoModelForCausalLM.from_config(vlm.config.get_text_config())
    shell.model = vlm.model.language_model
    shell.lm_head = vlm.lm_head
    return shell


def split_vlm_state_dict(
    state_dict: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """VLM names -> (text model names, vision names); an unknown name raises `KeyError`."""
    text: dict[str, torch.Tensor] = {}
    vision: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        if name.startswith(_TEXT_PREFIX):
            text["model." + name[len(_TEXT_PREFIX) :]] = tensor
        elif name.startswith("lm_head."):
            text[name] = tensor
        elif name.startswith(_VISION_PREFIXES):
            vision[name[len("model.") :]] = tensor
        else:
            raise KeyError(f"update_weights: unknown parameter name {name!r} for this VLM")
    return text, vision


class ImageEncoder:
    """Vision tower + projector of a LLaVA-style ``vlm`` with a per-image feature cache.

    ``vision`` turns images into pixel inputs (its own cache, by hash). Counters:
    ``forwards`` (vision forwards run) and ``encoded`` (images they encoded).
    Runs on the engine's compute thread only.
    """

    def __init__(
        self,
        vlm: torch.nn.Module,
        vision: VisionProcessor,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        check_vlm_supported(vlm)
        cfg = vlm.config
        self.vision = vision
        self.image_token_id = int(cfg.image_token_id)
        if vision.image_token_id != self.image_token_id:
            raise TemperError(
                f"the processor's image token id {vision.image_token_id} is not the model's "
                f"({self.image_token_id})"
            )
        self._feature_args = {
            "vision_feature_layer": cfg.vision_feature_layer,
            "vision_feature_select_strategy": cfg.vision_feature_select_strategy,
        }
        inner = vlm.model
        language = inner.language_model
        inner.language_model = None  # leave the text model out of the copy
        try:
            self.module = copy.deepcopy(inner).to(device=device, dtype=dtype).eval()
        finally:
            inner.language_model = language
        self.dtype, self.device = dtype, device
        self._features: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.forwards = 0
        self.encoded = 0

    def features(self, images: Sequence[Image]) -> list[torch.Tensor]:
        """Each image's features ``[tokens, hidden]``; missing ones in one vision forward."""
        missing = list({im.sha256: im for im in images if im.sha256 not in self._features}.values())
        if missing:
            pixels = self.vision.pixel_inputs(missing)
            pixels = {k: v.to(self.device) for k, v in pixels.items()}
            if "pixel_values" in pixels:
                pixels["pixel_values"] = pixels["pixel_values"].to(self.dtype)
            with torch.inference_mode():
                out = self.module.get_image_features(**pixels, **self._feature_args)
            self.forwards += 1
            self.encoded += len(missing)
            for image, feats in zip(missing, out.pooler_output, strict=True):
                self._features[image.sha256] = feats.reshape(-1, feats.shape[-1])
        out_list = []
        for image in images:
            self._features.move_to_end(image.sha256)
            out_list.append(self._features[image.sha256])
        while len(self._features) > CACHE_SIZE:
            self._features.popitem(last=False)
        return out_list

    def check_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Raise `KeyError`/`ValueError` unless `load_state_dict` can take all of ``state_dict``."""
        own = self.module.state_dict()
        for name, tensor in state_dict.items():
            if name not in own:
                raise KeyError(f"update_weights: unknown parameter name 'model.{name}'")
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(
                    f"update_weights: model.{name} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(own[name].shape)}"
                )

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy vision weights (names without the leading ``model.``) in place; the cached
        features came from the old weights and are dropped."""
        self.check_state_dict(state_dict)
        own = self.module.state_dict()
        with torch.no_grad():
            for name, tensor in state_dict.items():
                own[name].copy_(tensor)
        self.clear()

    def clear(self) -> None:
        """Forget every image's features (the weights that made them changed)."""
        self._features.clear()


def image_key(
    prompt: Sequence[int], spans: Sequence[tuple[int, int]], images: Sequence[Image]
) -> np.ndarray:
    """The prompt as the prefix cache and shared prefill see it: image tokens replaced by
    negative ids derived from the image's hash and the position in its run, so two
    prompts match only where their text *and* images agree."""
    key = np.asarray(prompt, dtype=np.int64).copy()
    for (start, length), image in zip(spans, images, strict=True):
        base = int(image.sha256[:12], 16) << 14
        key[start : start + length] = -1 - (base + np.arange(length, dtype=np.int64))
    return key


def request_images(
    encoder: ImageEncoder | None, prompt: list[int], images: list[Image]
) -> dict[str, Any]:
    """A request's image fields (`temper.engine.requests.Request`): the images, where
    each one's token run sits, and the prompt's cache key. Raises `TemperError` for
    images a text model is shown, or runs that do not match the images."""
    if encoder is None:
        if images:
            raise TemperError("this NativeEngine's model takes no images (it is a text model)")
        return {}
    spans = image_spans(prompt, encoder.image_token_id, len(images))
    for k, ((_, length), image) in enumerate(zip(spans, images, strict=True)):
        expected = len(encoder.vision.image_run(image))
        if length != expected:
            raise TemperError(
                f"image {k} has {length} image tokens in the prompt; its processor "
                f"expands it to {expected}"
            )
    return {"images": images, "spans": spans, "key": image_key(prompt, spans, images)}
