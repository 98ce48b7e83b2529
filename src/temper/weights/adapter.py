"""Adapter updates: a LoRA adapter as a state dict that travels like any weights.

A trainer with ``[lora]`` publishes, instead of the whole model, two tensors per
adapted linear layer, named after the layer's HF module name ``<module>``:

- ``<module>.lora_A``: A, ``[rank, in]``;
- ``<module>.lora_B``: B already multiplied by the adapter's scale (alpha / rank),
  ``[out, rank]``;

so the layer's weight ``<module>.weight`` becomes ``W = W0 + B @ A``. The update is
versioned and checked like a full one (any `WeightTransport` carries it); about
``rank x (in + out)`` values per layer instead of ``in x out``, a few MB for a model
of hundreds of MB. The merged delta ``B @ A`` would be as large as the weights
themselves, so it is never what travels.

An engine that takes adapter updates keeps an `AdapterBase`: on the first adapter
update it copies the base weight W0 of every adapted layer, and every update after
recomputes ``W = W0 + B @ A`` from that copy, so rounding never accumulates over
updates. A full update of a layer replaces its base.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

LORA_A = ".lora_A"
LORA_B = ".lora_B"


def is_adapter_update(state_dict: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``state_dict`` is an adapter update (every name a ``.lora_A``/``.lora_B``).

    A state dict that mixes adapter tensors with plain weights is refused
    (`ValueError`): nothing publishes one, and applying half of it would be wrong."""
    adapter = [name.endswith((LORA_A, LORA_B)) for name in state_dict]
    if any(adapter) and not all(adapter):
        plain = [name for name, a in zip(state_dict, adapter, strict=True) if not a]
        raise ValueError(f"a weight update mixes adapter tensors with weights {plain[:3]}")
    return bool(adapter) and all(adapter)


def adapter_pairs(
    state_dict: Mapping[str, torch.Tensor],
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{"<module>.weight": (A, scaled B)}`` of an adapter update; a layer with only one
    of its two tensors raises `KeyError`."""
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, a in state_dict.items():
        if not name.endswith(LORA_A):
            continue
        module = name.removesuffix(LORA_A)
        b = state_dict.get(module + LORA_B)
        if b is None:
            raise KeyError(f"adapter update: {module} has {LORA_A} but no {LORA_B}")
        pairs[module + ".weight"] = (a, b)
    if len(pairs) * 2 != len(state_dict):
        lone = [n for n in state_dict if n.endswith(LORA_B)]
        lone = [n for n in lone if n.removesuffix(LORA_B) + ".weight" not in pairs]
        raise KeyError(f"adapter update: {lone[:3]} have no {LORA_A}")
    return pairs


def check_fits(name: str, base: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """Raise `ValueError` unless ``b @ a`` has ``base``'s shape (and the ranks agree)."""
    fits = a.dim() == 2 and b.dim() == 2 and b.shape[1] == a.shape[0]
    if not fits or (b.shape[0], a.shape[1]) != tuple(base.shape):
        raise ValueError(
            f"adapter update: {name} has A {tuple(a.shape)} and B {tuple(b.shape)}, which "
            f"do not fit its weight of shape {tuple(base.shape)}"
        )


def merge(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``base + b @ a`` in float32, returned in ``base``'s dtype (a new tensor)."""
    device = base.device
    merged = torch.addmm(base.float(), b.to(device, torch.float32), a.to(device, torch.float32))
    return merged.to(base.dtype)


def merge_into(model: torch.nn.Module, update: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """Fold adapter ``update`` into ``model``'s weights in place (``W += B @ A`` per layer,
    checked as `AdapterBase` checks it) and return ``model``: the merged weights an
    engine's adapter is measured and tested against."""
    weights = dict(model.named_parameters())
    pairs = adapter_pairs(update)
    for name, (a, b) in pairs.items():
        check_fits(name, weights[name], a, b)
    with torch.no_grad():
        for name, (a, b) in pairs.items():
            weights[name].copy_(merge(weights[name], a, b))
    return model


class AdapterBase:
    """The base weights an engine's adapters merge into (see the module docstring)."""

    def __init__(self) -> None:
        self._base: dict[str, torch.Tensor] = {}

    def merged(
        self, update: Mapping[str, torch.Tensor], read: Callable[[str], torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The weights (HF names) that serve adapter ``update``: ``W0 + B @ A`` for each
        adapted layer, and W0 again for a layer adapted before but not now.

        ``read(name)`` returns a copy of the engine's weight ``name`` as HF lays it
        out; it is called once per layer, on the layer's first adapter update, and
        raises `KeyError` for a name the engine does not have. Every layer is checked
        before anything is kept, so a bad update leaves the engine as it was."""
        pairs = adapter_pairs(update)
        fresh = {name: read(name) for name in pairs if name not in self._base}
        for name, (a, b) in pairs.items():
            check_fits(name, fresh[name] if name in fresh else self._base[name], a, b)
        self._base.update(fresh)
        out = {name: merge(self._base[name], a, b) for name, (a, b) in pairs.items()}
        for name, base in self._base.items():
            out.setdefault(name, base)
        return out

    def forget(self, names: list[str] | Mapping[str, torch.Tensor]) -> None:
        """A full update of ``names``: those weights are a new base (kept at the next
        adapter update)."""
        for name in names:
            self._base.pop(name, None)
