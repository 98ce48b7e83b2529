"""The trainer's forward: response-token logits, each distinct prompt run once.

`response_logits` runs a `MicroBatch` (see `temper.trainer.batching`) through a
Hugging Face causal LM in two calls: the distinct prompts first (right-padded,
keeping their key/value cache), then every response on top of its prompt's
cache, gathered per row. Autograd flows through the gathered cache, so each
prompt's forward and backward run once for all of its responses. Position ids
are explicit (a response continues at its prompt's true length, past the
prompt padding) and the attention mask hides the padding, so the logits equal
those of the plain ``prompt + response`` forward up to float rounding.

Vision-language models get their image inputs in the same two calls: the
prompts' images with the prompt pass, the images of multi-turn observations
with the response pass (`MicroBatch.prompt_pixels` / `response_pixels`). HF VLMs
fill image-token positions with image features in row-major order, which is
the order `collate` concatenates them in.

It needs a model whose forward takes a key/value cache and ``position_ids`` and
returns a `transformers` `DynamicCache` (Llama, Qwen2/3, Mistral and most decoder
LMs). transformers 5.20 renamed the cache argument and output from
``past_key_values`` to ``cache``; both spellings are handled (vLLM's CPU build pins
transformers below 5.20).
"""

from __future__ import annotations

import functools
import inspect

import torch

from temper.trainer.batching import MicroBatch


def response_logits(model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
    """Float32 logits ``[B, R, vocab]``; position j predicts response token j."""
    r = mb.response_ids.shape[1]
    out = model(
        input_ids=mb.prompt_ids, attention_mask=mb.prompt_mask, use_cache=r > 1, **mb.prompt_pixels
    )
    n_prompts = mb.prompt_ids.shape[0]
    last = out.logits[torch.arange(n_prompts), mb.prompt_lengths - 1]  # [Np, V]
    first = last.index_select(0, mb.prompt_index).unsqueeze(1)  # [B, 1, V]
    if r == 1:
        return first.float()
    cache = getattr(out, "cache", None) or out.past_key_values
    cache.batch_select_indices(mb.prompt_index)
    start = mb.prompt_lengths.index_select(0, mb.prompt_index).unsqueeze(1)
    positions = start + torch.arange(r - 1).unsqueeze(0)
    mask = torch.cat((mb.prompt_mask.index_select(0, mb.prompt_index), mb.response_mask), dim=1)
    rest = model(
        input_ids=mb.response_ids[:, :-1],
        attention_mask=mask[:, :-1],
        position_ids=positions,
        use_cache=True,
        **{_cache_argument(type(model)): cache},
        # The last response token is not fed, but it is never part of an image
        # run (a generation prompt follows every observation), so all images are.
        **mb.response_pixels,
    ).logits
    return torch.cat((first, rest), dim=1).float()


@functools.cache
def _cache_argument(model_class: type) -> str:
    """``"cache"`` (transformers >= 5.20) or ``"past_key_values"`` (older)."""
    params = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
